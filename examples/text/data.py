"""Token sequences of length 8 (seeded): ids in [1, 32), 3 to 8 real tokens, the rest
padding (id 0, mask 0); no labels: every stage is judged by its agreement with the float
model."""

from __future__ import annotations

import numpy as np


def _split(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    mask = (np.arange(8) < rng.integers(3, 9, size=(n, 1))).astype(np.int64)
    ids = rng.integers(1, 32, size=(n, 8)) * mask
    return {"inputs": {"input_ids": ids, "attention_mask": mask}, "labels": None}


def load(calibration: int = 256, evaluation: int = 256) -> dict:
    return {"train": _split(calibration, 0), "evaluation": _split(evaluation, 1)}


def load_few() -> dict:
    """32 sequences per split: a quick look (and the example's test)."""
    return load(32, 32)
