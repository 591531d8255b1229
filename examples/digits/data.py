"""The digits example data: scikit-learn's bundled 8x8 handwritten digits (no download).

`load()` returns a fixed, seeded, stratified split of the 1797 images: 1000 frames held
out for evaluation and the remaining 797 for training (the pipeline draws its
calibration samples from the training split).
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

EVALUATION_SIZE = 1000
SPLIT_SEED = 20240607


def _normalize(images: np.ndarray) -> np.ndarray:
    """Scale raw 0..16 pixels to [0, 1], then to [-1, 1] symmetric about 0, as NCHW float32."""
    unit = images.astype(np.float32) / np.float32(16.0)
    symmetric = (unit - np.float32(0.5)) / np.float32(0.5)
    return np.ascontiguousarray(symmetric[:, None, :, :], dtype=np.float32)


def _digits_csv() -> Path:
    """scikit-learn's bundled digits file, found without importing sklearn (1.1 s)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the digits example needs scikit-learn (pip install scikit-learn)"
        )
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def _read_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images N x 8 x 8 with raw 0..16 pixels, labels), as sklearn's load_digits reads them."""
    with gzip.open(_digits_csv(), "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float64)
    return table[:, :64].reshape(-1, 8, 8), table[:, 64].astype(np.int64)


def _stratified_eval_indices(y: np.ndarray, n_eval: int, seed: int) -> np.ndarray:
    """A seeded stratified choice of ``n_eval`` indices: per class in proportion to its size
    (largest remainders get the leftover), each class's pick a seeded permutation."""
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    share = counts * n_eval / len(y)
    take = np.floor(share).astype(int)
    take[np.argsort(-(share - take), kind="stable")[: n_eval - take.sum()]] += 1
    picks = [
        rng.permutation(np.flatnonzero(y == c))[:k] for c, k in zip(classes, take, strict=True)
    ]
    return np.sort(np.concatenate(picks))


def load() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return ``{"train": (x, y), "evaluation": (x, y)}`` for the digits dataset.

    ``x`` is float32 of shape (N, 1, 8, 8) with values in [-1, 1]; ``y`` is int64 class
    labels 0..9. The split is stratified by label, seeded, and identical on every call.
    """
    images, y = _read_digits()
    x = _normalize(images)
    is_eval = np.zeros(len(y), dtype=bool)
    is_eval[_stratified_eval_indices(y, EVALUATION_SIZE, SPLIT_SEED)] = True
    return {
        "train": (np.ascontiguousarray(x[~is_eval]), y[~is_eval]),
        "evaluation": (np.ascontiguousarray(x[is_eval]), y[is_eval]),
    }
