"""A one-stage detector as deployed: torchvision's SSDlite (MobileNetV3-Large backbone,
320 x 320, 21 classes), its forward cut before the post-processing.

``build()`` returns :class:`RawSSD`: torchvision's own ``ssdlite320_mobilenet_v3_large``
(seeded random init, nothing downloaded; every BatchNorm's running statistics set from the
zoo's images as the zoo's models do, so activations have a trained network's ranges) whose
forward returns the raw per-scale maps the BPU
computes, ``{"scores": [6 maps (N, A*C, H, W)], "boxes": [6 maps (N, A*4, H, W)]}`` for
the six feature maps (20x20 down to 1x1), as vendors deploy detectors: anchor decoding,
softmax over classes and NMS run on the CPU after the board. The chain carries each map as
an output of its own (``output.scores.0`` .. ``output.boxes.5``).
"""

from __future__ import annotations

import torch
from torch import nn

from examples.zoo import images, libs
from examples.zoo.models import set_batchnorm_statistics

SIZE = 320
CLASSES = 21


class RawSSD(nn.Module):
    """SSDlite's backbone and head, per-scale raw maps out (no decoding, no NMS)."""

    def __init__(self, ssd: nn.Module) -> None:
        super().__init__()
        self.backbone = ssd.backbone
        self.cls_heads = ssd.head.classification_head.module_list
        self.box_heads = ssd.head.regression_head.module_list

    def forward(self, x: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        features = list(self.backbone(x).values())
        return {
            "scores": [head(f) for head, f in zip(self.cls_heads, features, strict=True)],
            "boxes": [head(f) for head, f in zip(self.box_heads, features, strict=True)],
        }


def ssdlite(seed: int = 0) -> nn.Module:
    """torchvision's SSDlite320 MobileNetV3-Large, seeded random init, eval mode."""
    torch.manual_seed(seed)
    detection = libs.torchvision().models.detection
    return detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES
    ).eval()


def build(seed: int = 0, size: int = SIZE) -> RawSSD:
    """The raw-map detector (module docstring); BatchNorm statistics from ``size`` crops
    (the test's smaller input)."""
    x = torch.from_numpy(images.crops(32, size, seed=1234))
    return set_batchnorm_statistics(RawSSD(ssdlite(seed)), x)
