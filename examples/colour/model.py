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
import hashlib
import inspect
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from examples.colour import data
from simulator import board_input

log = logging.getLogger(__name__)

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
NUM_CLASSES = 20
HYPERPARAMETERS = {
    "seed": 0,
    "epochs": 15,
    "batch_size": 64,
    "lr": 3e-3,
    "weight_decay": 1e-4,
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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ColourCNN()
    return model.eval()


@functools.cache
def cache_key(format: str) -> str:
    """Short sha256 of the format, model/training/data/board-input source, hyperparameters
    and torch major.minor. Computed once per process and format."""
    sources = [inspect.getsource(obj) for obj in (ConvBNReLU, ColourCNN, _train, _fit)]
    sources += [inspect.getsource(data), inspect.getsource(board_input)]
    torch_version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    payload = json.dumps(
        {
            "format": format,
            "sources": sources,
            "hyperparameters": HYPERPARAMETERS,
            "torch": torch_version,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cache_path(format: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where `build(format)` caches weights (``colour_cnn_<format>-<key>.safetensors``)."""
    if format not in data.FORMATS:
        raise ValueError(f"unknown training format {format!r}; use one of {data.FORMATS}")
    folder = Path(cache_dir) if cache_dir is not None else CACHE_DIR
    return folder / f"colour_cnn_{format}-{cache_key(format)}.safetensors"


def _train(x: np.ndarray, y: np.ndarray, hp: dict) -> ColourCNN:
    """Train a fresh `ColourCNN` deterministically with Adam + cosine schedule on (x, y).

    Runs on one intra-op thread (restored afterwards): bit-stable across machines, and on a
    busy two-core box several times faster than two threads for a net this small.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _fit(x, y, hp)
    finally:
        torch.set_num_threads(threads)


def _fit(x: np.ndarray, y: np.ndarray, hp: dict) -> ColourCNN:
    """The training loop of `_train` (seeded init, seeded shuffle, no augmentation)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(hp["seed"])
        shuffle = torch.Generator().manual_seed(hp["seed"])
        model = ColourCNN().train()
        optimizer = torch.optim.Adam(
            model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"]
        )
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=hp["epochs"])
        inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
        for _ in range(hp["epochs"]):
            order = torch.randperm(len(x), generator=shuffle)
            for start in range(0, len(x), hp["batch_size"]):
                idx = order[start : start + hp["batch_size"]]
                loss = nn.functional.cross_entropy(model(inputs[idx]), targets[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            schedule.step()
    return model.eval()


def _save_atomic(model: nn.Module, path: Path, key: str) -> None:
    """Write the model's state dict as safetensors via a temp file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(state, tmp, metadata={"cache_key": key})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@torch.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``model`` on (x, y)."""
    logits = model(torch.from_numpy(x))
    return float((logits.argmax(1) == torch.from_numpy(y)).float().mean())


def build(format: str = "rgb", cache_dir: str | os.PathLike[str] | None = None) -> ColourCNN:
    """Return a `ColourCNN` trained on ``data.load(format)``, in eval mode.

    Trains and caches on a miss; weights live at `cache_path(format, cache_dir)` and load
    with ``safetensors.torch.load_file`` (no pickle).
    """
    path = cache_path(format, cache_dir)
    if path.exists():
        model = ColourCNN()
        model.load_state_dict(load_file(path), strict=True)
        return model.eval()
    x, y = data.load(format)["train"]
    model = _train(x, y, HYPERPARAMETERS)
    _save_atomic(model, path, cache_key(format))
    log.info("trained colour CNN on %s, cached at %s", format, path)
    return model


def build_rgb(cache_dir: str | os.PathLike[str] | None = None) -> ColourCNN:
    """The model trained on RGB [-1, 1] frames (the spec's model factory)."""
    return build("rgb", cache_dir)


def build_yuv444(cache_dir: str | os.PathLike[str] | None = None) -> ColourCNN:
    """The model trained on centered YUV444 / 128 through the board's nv12 camera path."""
    return build("yuv444", cache_dir)
