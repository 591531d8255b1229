"""The colour example model: a small CNN, trained once per training format.

`build_rgb()` and `build_yuv444()` return a trained `ColourCNN` in eval mode, trained on
`data.load("rgb")` or `data.load("yuv444")`. Weights are cached as safetensors under
``examples/colour/.cache/`` with a key derived from the format, the architecture and
training source, the data and board-input source, the hyperparameters and the torch
major.minor version, so any of those changing retrains on the next call. Training is
deterministic and takes a few seconds per format on two CPU cores.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples import weights
from examples.colour import data
from examples.digits.model import ConvBNReLU
from examples.weights import accuracy as accuracy
from simulator.arith import board_input

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
NUM_CLASSES = 20
HYPERPARAMETERS = {
    "seed": 0,
    "epochs": 15,
    "batch_size": 64,
    "lr": 3e-3,
    "weight_decay": 1e-4,
}


class ColourCNN(nn.Module):
    """Small CNN for 3x16x16 colour frames, 20 classes; returns logits from ``head``.

    Layout (module paths): ``stem`` conv-bn-relu 3->16 -> ``body`` conv-bn-relu 16->32 ->
    ``pool`` max 4x4 (16x16 -> 4x4) -> flatten -> ``head`` Linear 512->20.
    """

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = ConvBNReLU(3, 16)
        self.body = ConvBNReLU(16, 32)
        self.pool = nn.MaxPool2d(4)
        self.head = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a (N, 3, 16, 16) batch to (N, num_classes) logits."""
        x = self.pool(self.body(self.stem(x)))
        return self.head(torch.flatten(x, 1))


def build_untrained(seed: int = 0) -> ColourCNN:
    """Return a `ColourCNN` with a seeded random init, in eval mode (global RNG untouched)."""
    return weights.untrained(ColourCNN, seed)


@functools.cache
def cache_key(format: str) -> str:
    """Short sha256 of the format, model/training/data/board-input source, hyperparameters
    and torch major.minor. Computed once per process and format."""
    objects = (ConvBNReLU, ColourCNN, _train, weights.single_thread, weights.fit)
    return weights.source_key((*objects, data, board_input), HYPERPARAMETERS, format=format)


def cache_path(format: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where `build(format)` caches weights (``colour_cnn_<format>-<key>.safetensors``)."""
    if format not in data.FORMATS:
        raise ValueError(f"unknown training format {format!r}; use one of {data.FORMATS}")
    return weights.cache_file(CACHE_DIR, cache_dir, f"colour_cnn_{format}", cache_key(format))


def _train(x: np.ndarray, y: np.ndarray, hp: dict) -> ColourCNN:
    """Train a fresh `ColourCNN` deterministically with Adam + cosine schedule on (x, y)
    (seeded init, seeded shuffle, no augmentation), on one intra-op thread."""
    with weights.single_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(hp["seed"])
        model = ColourCNN()
        optimizer = torch.optim.Adam(
            model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"]
        )
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=hp["epochs"])
        return weights.fit(model, optimizer, x, y, hp, epoch_schedule=schedule)


def build(format: str = "rgb", cache_dir: str | os.PathLike[str] | None = None) -> ColourCNN:
    """Return a `ColourCNN` trained on ``data.load(format)``, in eval mode.

    Trains and caches on a miss; weights live at `cache_path(format, cache_dir)` and load
    with ``safetensors.torch.load_file`` (no pickle).
    """
    return weights.load_or_train(
        cache_path(format, cache_dir),
        cache_key(format),
        ColourCNN,
        lambda: _train(*data.load(format)["train"], HYPERPARAMETERS),
    )


def build_rgb(cache_dir: str | os.PathLike[str] | None = None) -> ColourCNN:
    """The model trained on RGB [-1, 1] frames (the spec's model factory)."""
    return build("rgb", cache_dir)


def build_yuv444(cache_dir: str | os.PathLike[str] | None = None) -> ColourCNN:
    """The model trained on centered YUV444 / 128 through the board's nv12 camera path."""
    return build("yuv444", cache_dir)
