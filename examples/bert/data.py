"""Token embeddings for the BERT example: seeded N(0, 1) vectors (N, SEQ, HIDDEN), no labels.

The encoder has no trained vocabulary, so its inputs are float token embeddings
(``inputs_embeds``); without labels every stage is scored by its agreement with the float
model (output cosine, the primary metric of an unlabelled run).
"""

from __future__ import annotations

import numpy as np

from examples.bert.model import MINILM, SEQ


def tokens(n: int, hidden: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, SEQ, hidden)).astype(np.float32)


def load(hidden: int = MINILM["hidden"]) -> dict:
    """128 calibration and 256 evaluation sequences (the spec's counts cut them)."""
    return {
        "train": {"inputs": {"x": tokens(128, hidden, 1)}, "labels": None},
        "evaluation": {"inputs": {"x": tokens(256, hidden, 2)}, "labels": None},
    }


def small() -> dict:
    """The same at hidden 256 (the test's reduced model: two outlier dimensions stay under
    1% of the values, as in MiniLM's 384)."""
    return load(256)
