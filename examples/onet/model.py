"""An ONet-shaped face refiner (MTCNN's third net): a conv + PReLU stack on 48x48 crops and
three heads, returned as MTCNN's ONet returns them: ``(boxes, landmarks, face)``.

- ``boxes``: box regression, 4 offsets (``output.0``);
- ``landmarks``: five (x, y) points, 10 values (``output.1``);
- ``face``: face / not-face probability, a softmax over 2 (``output.2``).

Weights are seeded, not trained: the example is about carrying and scoring three outputs
through the chain, which needs no task accuracy.
"""

from __future__ import annotations

import torch
from torch import nn


def _block(c_in: int, c_out: int, k: int, pool: int | None, stride: int = 2) -> list[nn.Module]:
    layers = [nn.Conv2d(c_in, c_out, k), nn.PReLU(c_out)]
    return layers + ([nn.MaxPool2d(pool, stride, ceil_mode=True)] if pool else [])


class ONet(nn.Module):
    """3x48x48 -> conv32/pool3 -> conv64/pool3 -> conv64/pool2 -> conv128 -> dense256 -> heads."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            *_block(3, 32, 3, 3), *_block(32, 64, 3, 3), *_block(64, 64, 3, 2),
            *_block(64, 128, 2, None),
        )  # fmt: skip
        self.dense = nn.Linear(128 * 3 * 3, 256)
        self.act = nn.PReLU(256)
        self.face = nn.Linear(256, 2)
        self.boxes = nn.Linear(256, 4)
        self.landmarks = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.act(self.dense(self.features(x).flatten(1)))
        return self.boxes(y), self.landmarks(y), torch.softmax(self.face(y), dim=1)


def build(seed: int = 0) -> ONet:
    """The seeded ONet in eval mode."""
    torch.manual_seed(seed)
    return ONet().eval()
