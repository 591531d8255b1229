"""Progress ticks from inside a stage loop reach the listener, and only inside its block."""

import numpy as np
import torch

from stages.data import Split
from stages.evaluate import collect
from stages.progress import listening, tick


def test_evaluation_ticks_per_batch_while_listened_to():
    split = Split("evaluation", {"x": np.zeros((5, 3), np.float32)}, np.zeros(5, np.int64))
    seen = []
    with listening(lambda task, done, total: seen.append((task, done, total))):
        out = collect(lambda x: torch.ones(len(x), 2), split, 2, "convert")
    assert out["output"].shape == (5, 2)
    assert seen == [("convert", 2, 5), ("convert", 4, 5), ("convert", 5, 5)]
    tick("after", 1, 1)  # nobody listens: nothing happens
    assert len(seen) == 3
