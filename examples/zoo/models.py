"""The zoo's models: each built by its library exactly as the library defines it.

No ``inplace`` edits, no replaced modules: the factory calls the library's constructor
with its defaults but a 10-class head (``num_classes=10``: with seeded, untrained weights
a 1000-way argmax is a near tie, so agreement would measure ties, not the chain), seeds
the weights (``torch.manual_seed(0)``; pretrained weights would
need a download), then sets every BatchNorm's running statistics from one forward pass
over the zoo's images (:mod:`examples.zoo.images`), so activations have the ranges a
trained network's would. A spec names a model as ``examples.zoo.models:<name>`` (and
``small_<name>`` for the same architecture at the reduced input size tests use).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from examples.zoo import images, libs


@dataclass(frozen=True)
class Entry:
    """One zoo architecture: library, constructor, its arguments, native input size."""

    library: str  # "torchvision" or "timm"
    name: str  # torchvision.models.<name> or timm.create_model(<name>)
    size: int = 224
    kwargs: dict = field(default_factory=dict)
    small: int | None = 64  # reduced input size for tests (None: the model needs its own)
    size_arg: str | None = None  # the constructor's input-size argument, when it has one
    task: str = "classify"  # or "segment": a dict output {"out": N x C x H x W}, no labels


CLASSES = 10
_NO_BACKBONE = {"weights_backbone": None}  # segmentation builders download one by default
ZOO: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry("torchvision", "resnet18"),
        Entry("torchvision", "resnet50"),
        Entry("torchvision", "resnext50_32x4d"),
        Entry("torchvision", "wide_resnet50_2"),
        Entry("torchvision", "mobilenet_v2"),
        Entry("torchvision", "mobilenet_v3_small", small=32),
        Entry("torchvision", "mobilenet_v3_large"),
        Entry("torchvision", "efficientnet_b0"),
        Entry("torchvision", "regnet_x_400mf"),
        Entry("torchvision", "regnet_y_400mf"),
        Entry("torchvision", "shufflenet_v2_x0_5"),
        Entry("torchvision", "squeezenet1_1"),
        Entry("torchvision", "mnasnet0_5"),
        Entry("torchvision", "googlenet", kwargs={"aux_logits": False, "init_weights": True}),
        Entry("torchvision", "inception_v3", 299, {"aux_logits": False, "init_weights": True}, 96),
        Entry("torchvision", "densenet121"),
        Entry("torchvision", "convnext_tiny"),
        Entry("torchvision", "vit_b_16", small=32, size_arg="image_size"),
        Entry("torchvision", "swin_t", small=32),
        Entry("timm", "efficientnet_lite0"),
        Entry("timm", "vit_tiny_patch16_224", small=32, size_arg="img_size"),
        Entry("timm", "deit_tiny_patch16_224", small=32, size_arg="img_size"),
        Entry("timm", "mobilevit_xxs", 256),
        Entry("timm", "levit_128s", size_arg="img_size"),
        Entry("timm", "efficientformer_l1", small=None),
        Entry("timm", "ghostnet_100"),
        Entry("timm", "repvgg_a0"),
        Entry("timm", "mixer_s16_224", size_arg="img_size"),
        Entry("timm", "regnety_002"),
        Entry("timm", "resnet18d"),
        Entry("timm", "lcnet_050"),
        Entry("timm", "convnext_atto"),
        Entry("torchvision", "lraspp_mobilenet_v3_large", kwargs=_NO_BACKBONE, task="segment"),
        Entry(
            "torchvision", "deeplabv3_mobilenet_v3_large", kwargs=_NO_BACKBONE, task="segment"
        ),  # fmt: skip
        Entry("torchvision", "fcn_resnet50", kwargs=_NO_BACKBONE, task="segment"),
    ]
}


def construct(entry: Entry, size: int | None = None) -> nn.Module:
    """The library's own model, seeded; built for ``size`` when its constructor takes an
    input size (a ViT's position embeddings follow its patch grid)."""
    torch.manual_seed(0)
    kwargs = {"num_classes": CLASSES, **entry.kwargs}
    if entry.size_arg and size and size != entry.size:
        kwargs[entry.size_arg] = size
    if entry.library == "torchvision":
        models = libs.torchvision().models
        where = models.segmentation if entry.task == "segment" else models
        return getattr(where, entry.name)(**kwargs)
    return libs.timm().create_model(entry.name, pretrained=False, **kwargs)


def set_batchnorm_statistics(model: nn.Module, x: torch.Tensor, batch: int = 16) -> nn.Module:
    """Running mean/var of every BatchNorm = the average over ``x`` (cumulative, momentum
    None), everything else untouched; returns the model in eval mode."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    with torch.no_grad():
        for start in range(0, len(x), batch):
            model(x[start : start + batch])
    for bn in bns:
        bn.momentum = 0.1
    return model.eval()


def build(name: str, size: int | None = None) -> nn.Module:
    """A zoo model with seeded weights and image BatchNorm statistics."""
    entry = ZOO[name]
    model = construct(entry, size)
    x = images.crops(32, size or entry.size, seed=1234)
    return set_batchnorm_statistics(model, torch.from_numpy(x))


def entry_of(attr: str) -> tuple[Entry, int]:
    """``resnet18`` -> (entry, native size); ``small_resnet18`` -> (entry, reduced size)."""
    small = attr.startswith("small_")
    entry = ZOO.get(attr.removeprefix("small_"))
    if entry is None or (small and entry.small is None):
        raise AttributeError(f"no zoo model {attr!r}; the zoo has {sorted(ZOO)}")
    return entry, entry.small if small else entry.size


def __getattr__(attr: str):
    """``examples.zoo.models:<name>`` as a spec's model factory."""
    if attr.startswith("__"):
        raise AttributeError(attr)
    entry, size = entry_of(attr)
    return lambda: build(entry.name, size)
