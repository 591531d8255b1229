"""The digits example model: a small residual CNN with a sigmoid channel gate.

`build()` returns a trained `DigitsCNN` in eval mode. Trained weights are cached as
safetensors under ``examples/digits/.cache/`` with a key derived from the architecture
source, the training code and hyperparameters, and the torch major.minor version, so any
of those changing retrains on the next call. Training is deterministic and takes a few
seconds on two CPU cores.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples import weights
from examples.digits import data

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
HYPERPARAMETERS = {
    "seed": 0,
    "epochs": 40,
    "batch_size": 32,
    "lr": 3e-3,
    "weight_decay": 1e-4,
    "max_shift": 1,
}


class ConvBNReLU(nn.Module):
    """A 3x3 convolution (padding 1, no bias), batch norm and ReLU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply conv, bn and relu."""
        return self.relu(self.bn(self.conv(x)))


class ResidualBlock(nn.Module):
    """A basic residual block: conv-bn-relu, conv-bn, add the input, relu."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``relu(x + bn2(conv2(relu(bn1(conv1(x))))))``."""
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + x)


class DigitsCNN(nn.Module):
    """Small CNN for 1x8x8 digits, 10 classes; returns logits from the linear ``head``.

    Layout (module paths): ``stem`` (1->16) -> ``block1`` (residual, 16) -> ``pool``
    (8x8 -> 4x4) -> ``widen`` (16->32) -> sigmoid channel gate ``gate`` -> ``avgpool``
    -> ``head`` (32->10).
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = ConvBNReLU(1, 16)
        self.block1 = ResidualBlock(16)
        self.pool = nn.MaxPool2d(2)
        self.widen = ConvBNReLU(16, 32)
        self.gate = nn.Linear(32, 32)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a (N, 1, 8, 8) batch to (N, num_classes) logits."""
        x = self.stem(x)
        x = self.block1(x)
        x = self.pool(x)
        x = self.widen(x)
        g = torch.sigmoid(self.gate(x.mean((2, 3))))
        x = x * g[:, :, None, None]
        x = torch.flatten(self.avgpool(x), 1)
        return self.head(x)


def build_untrained(seed: int = 0) -> DigitsCNN:
    """Return a `DigitsCNN` with a seeded random init, in eval mode (global RNG untouched)."""
    return weights.untrained(DigitsCNN, seed)


@functools.cache
def cache_key() -> str:
    """Short sha256 of the architecture and training source, hyperparameters, torch version.

    Computed once per process (the source does not change while it runs).
    """
    objects = (ConvBNReLU, ResidualBlock, DigitsCNN, _shift_batch, _train, weights.fit, data.load)
    return weights.source_key(objects, HYPERPARAMETERS)


def cache_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return where `build()` caches the trained weights (``digits_cnn-<key>.safetensors``)."""
    return weights.cache_file(CACHE_DIR, cache_dir, "digits_cnn", cache_key())


def _shift_batch(x: np.ndarray, rng: np.random.Generator, max_shift: int) -> np.ndarray:
    """Translate each image by up to ``max_shift`` pixels, filling with background (-1)."""
    if max_shift <= 0:
        return x
    n, _, h, w = x.shape
    padded = np.pad(
        x, ((0, 0), (0, 0), (max_shift, max_shift), (max_shift, max_shift)), constant_values=-1.0
    )
    offsets = rng.integers(0, 2 * max_shift + 1, size=(n, 2))
    out = np.empty_like(x)
    for i, (dy, dx) in enumerate(offsets):
        out[i] = padded[i, :, dy : dy + h, dx : dx + w]
    return out


def _train(x: np.ndarray, y: np.ndarray, hp: dict) -> DigitsCNN:
    """Train a fresh `DigitsCNN` deterministically with Adam + cosine schedule and random
    shifts of up to ``max_shift`` pixels on (x, y); return it in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(hp["seed"])
        rng = np.random.default_rng(hp["seed"])
        model = DigitsCNN()
        optimizer = torch.optim.Adam(
            model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"]
        )
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=hp["epochs"])
        return weights.fit(
            model,
            optimizer,
            x,
            y,
            hp,
            epoch_schedule=schedule,
            augment=lambda batch: _shift_batch(batch, rng, hp["max_shift"]),
        )


def build(cache_dir: str | os.PathLike[str] | None = None) -> DigitsCNN:
    """Return a trained `DigitsCNN` in eval mode, training and caching it on a cache miss.

    Weights live at `cache_path(cache_dir)` (default ``examples/digits/.cache/``) and are
    loaded with ``safetensors.torch.load_file`` (no pickle).
    """
    return weights.load_or_train(
        cache_path(cache_dir),
        cache_key(),
        DigitsCNN,
        lambda: _train(*data.load()["train"], HYPERPARAMETERS),
    )
