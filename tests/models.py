"""Tiny models and datasets the tests name in specs (``tests.models:...``).

Small, seeded and instant: they exercise the chain without training.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class TinyNet(nn.Module):
    """conv-bn-relu, a residual add, max-pool, sigmoid gate, linear head: the digits shape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(y + self.conv2(y))
        y = self.pool(y) * torch.sigmoid(y.mean((2, 3), keepdim=True))
        return self.head(y.flatten(1))


class CumsumNet(TinyNet):
    """Uses cumsum, which qparity does not model: prepare must refuse it by name."""

    def forward(self, x):
        return super().forward(torch.cumsum(x, dim=2))


class BranchyNet(TinyNet):
    """Data-dependent Python control flow: torch.export cannot trace it."""

    def forward(self, x):
        if x.sum() > 0:
            return super().forward(x)
        return super().forward(-x)


def _seeded(cls):
    torch.manual_seed(0)
    m = cls()
    with torch.no_grad():  # non-trivial BN statistics, so folding is visible
        m.bn.running_mean.uniform_(-0.2, 0.2)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def tiny() -> nn.Module:
    return _seeded(TinyNet)


def cumsum() -> nn.Module:
    return _seeded(CumsumNet)


def branchy() -> nn.Module:
    return _seeded(BranchyNet)


def data() -> dict:
    """Random 1x8x8 inputs; labels from the tiny net itself, so float top-1 is 1.0."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(160, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        y = tiny()(torch.from_numpy(x)).argmax(1).numpy()
    return {"train": (x[:96], y[:96]), "evaluation": (x[96:], y[96:])}


def nan_data() -> dict:
    """Like data(), with a NaN in evaluation sample 7."""
    d = data()
    x, y = d["evaluation"]
    x = x.copy()
    x[7, 0, 3, 3] = np.nan
    return {"train": d["train"], "evaluation": (x, y)}
