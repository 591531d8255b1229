"""Progress ticks from inside a stage loop reach the listener, and only inside its block."""

import numpy as np
import torch

from stages.data import Split
from stages.evaluate import top1
from stages.progress import listening, tick


def test_top1_ticks_per_batch_while_listened_to():
    split = Split("evaluation", {"x": np.zeros((5, 3), np.float32)}, np.zeros(5, np.int64))
    seen = []
    with listening(lambda task, done, total: seen.append((task, done, total))):
        assert top1(lambda x: torch.ones(len(x), 2), split, batch_size=2) == 1.0
    assert seen == [("top-1", 2, 5), ("top-1", 4, 5), ("top-1", 5, 5)]
    tick("after", 1, 1)  # nobody listens: nothing happens
    assert len(seen) == 3
