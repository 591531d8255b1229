"""torchvision and timm beside whichever torch build is installed: stages.libs (the spec
loader uses it too)."""

from stages.libs import timm, torchvision

__all__ = ["timm", "torchvision"]
