"""The zoo's images: crops of the two photographs scikit-learn ships (no download).

``sklearn.datasets.load_sample_images()`` holds china.jpg and flower.jpg (427 x 640 RGB).
A crop takes a random square of 30-100% of the short side at a random place, flips it
half of the time and resizes it (bilinear, antialiased) to ``size``; values are
normalized with the ImageNet mean and std the libraries' models expect. Seeded: the same
arguments give the same array.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


@functools.cache
def photos() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_sample_images

    return tuple(np.asarray(img) for img in load_sample_images().images)


def crops(n: int, size: int, seed: int) -> np.ndarray:
    """``n`` normalized crops, float32 N x 3 x size x size."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        out[i] = _crop(photos()[i % 2], size, rng)
    return out


def _crop(img: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    h, w, _ = img.shape
    side = int(rng.uniform(0.3, 1.0) * min(h, w))
    top, left = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
    patch = img[top : top + side, left : left + side]
    if rng.random() < 0.5:
        patch = patch[:, ::-1]
    t = torch.from_numpy(np.ascontiguousarray(patch)).permute(2, 0, 1)[None].float() / 255
    t = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return ((t[0].permute(1, 2, 0).numpy() - MEAN) / STD).transpose(2, 0, 1)
