"""The digits example data: scikit-learn's bundled 8x8 handwritten digits (no download).

`load()` returns a fixed, seeded, stratified split of the 1797 images: 1000 frames held
out for evaluation and the remaining 797 for training (the pipeline draws its
calibration samples from the training split).
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

EVALUATION_SIZE = 1000
SPLIT_SEED = 20240607


def _normalize(images: np.ndarray) -> np.ndarray:
    """Scale raw 0..16 pixels to [0, 1], then to [-1, 1] symmetric about 0, as NCHW float32."""
    unit = images.astype(np.float32) / np.float32(16.0)
    symmetric = (unit - np.float32(0.5)) / np.float32(0.5)
    return np.ascontiguousarray(symmetric[:, None, :, :], dtype=np.float32)


def load() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return ``{"train": (x, y), "evaluation": (x, y)}`` for the digits dataset.

    ``x`` is float32 of shape (N, 1, 8, 8) with values in [-1, 1]; ``y`` is int64 class
    labels 0..9. The split is stratified by label, seeded, and identical on every call.
    """
    bunch = load_digits()
    x = _normalize(bunch.images)
    y = bunch.target.astype(np.int64)
    x_train, x_eval, y_train, y_eval = train_test_split(
        x, y, test_size=EVALUATION_SIZE, stratify=y, random_state=SPLIT_SEED, shuffle=True
    )
    return {
        "train": (np.ascontiguousarray(x_train), np.ascontiguousarray(y_train)),
        "evaluation": (np.ascontiguousarray(x_eval), np.ascontiguousarray(y_eval)),
    }
