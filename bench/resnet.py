"""A ResNet-18-shaped network at 224x224x3 and a small random dataset, for bench/simulator.py.

torchvision is not installed, so the architecture is written out here: conv 7x7 stride 2
+ BN + ReLU + max-pool 3x3 stride 2, four stages of two BasicBlocks (64, 128, 256, 512
channels; the first block of stages 2-4 strides 2 and has a 1x1 conv + BN downsample),
adaptive average pool, fc 1000.

Weights are random but seeded (Kaiming init, random BN affine), and the BatchNorm running
statistics are set from a forward pass over seeded random images, so activations stay well
scaled through the 18 layers (a random net with identity BN statistics drifts in scale,
which makes quantization meaningless). ``load()`` returns a few random 224x224 images,
smooth at low frequency plus noise, labelled with the float model's own argmax so that
top-1 of the quantized stages measures agreement with the float model.

    spec: model.factory = bench.resnet:build, data.dataset = bench.resnet:load
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SEED = 18
SIZE = 224
CLASSES = 1000
CALIBRATION = 16
EVALUATION = 8
BN_STAT_IMAGES = 16


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU, conv3x3-BN, add the (downsampled) input, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)


class ResNet18(nn.Module):
    """ResNet-18 (torchvision layout and module names: conv1, bn1, layer1..4, fc)."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, cin = (64, 128, 256, 512), 64
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(
                self,
                f"layer{i + 1}",
                nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1)),
            )
            cin = w
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def images(n: int, seed: int) -> np.ndarray:
    """``n`` seeded random images, N x 3 x 224 x 224 float32, roughly zero mean, unit std:
    low-frequency structure (8x8 noise upsampled) plus fine noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(n, 3, 8, 8, generator=g)
    x = F.interpolate(coarse, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    x = x + 0.3 * torch.randn(n, 3, SIZE, SIZE, generator=g)
    x = (x - x.mean()) / x.std()
    return x.numpy().astype(np.float32)


@functools.cache
def _state() -> dict[str, torch.Tensor]:
    """The seeded weights and BN statistics (computed once per process, about 1 s)."""
    torch.manual_seed(SEED)
    model = ResNet18()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(1.0 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                m.momentum = None  # cumulative average over the statistics pass
        model.train()
        model(torch.from_numpy(images(BN_STAT_IMAGES, SEED + 2)))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build() -> ResNet18:
    """The seeded ResNet-18 in eval mode (same weights every call, every process)."""
    model = ResNet18()
    model.load_state_dict(_state())
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1
    return model.eval()


@functools.cache
def _dataset() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    model = build()
    out = {}
    for split, n, seed in (("train", CALIBRATION, SEED + 3), ("evaluation", EVALUATION, SEED + 4)):
        x = images(n, seed)
        with torch.inference_mode():
            y = model(torch.from_numpy(x)).argmax(1).numpy().astype(np.int64)
        out[split] = (x, y)
    return out


def load() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (x, y), "evaluation": (x, y)}``: 16 calibration and 8 evaluation images,
    labels the float model's argmax (so the float model's top-1 is 1.0 by construction)."""
    return {k: (x.copy(), y.copy()) for k, (x, y) in _dataset().items()}
