"""Dataset-level judgement of a stage model: top-1 over the evaluation split, streamed."""

from __future__ import annotations

from collections.abc import Callable

import torch

from stages.data import Split
from stages.progress import tick


def first_output(out) -> torch.Tensor:
    """The first tensor of a model's output (models may return tuples)."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


@torch.no_grad()
def top1(
    model: Callable[[torch.Tensor], object], split: Split, batch_size: int, task: str = "top-1"
) -> float:
    """Share of samples whose arg-max output equals the label (progress ticks per batch)."""
    correct = done = 0
    for _, x, y in split.batches(batch_size):
        correct += int((first_output(model(x)).argmax(1) == y).sum())
        done += len(y)
        tick(task, done, len(split))
    return correct / len(split)
