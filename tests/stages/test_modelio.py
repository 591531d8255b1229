"""modelio: the float model from a spec's factory, its keyword arguments and weights."""

from __future__ import annotations

import pytest
import torch

from schemas.errors import StageError
from stages.modelio import build_float, model_digest


def test_model_kwargs_reach_the_factory_and_the_digest(make_ctx):
    """``model.kwargs`` names a library's generic constructor, as timm's is written."""
    ctx = make_ctx(
        model={"factory": "timm:create_model",
               "kwargs": {"model_name": "resnet10t", "num_classes": 10, "in_chans": 1}},
    )  # fmt: skip
    model = ctx.float_model
    assert type(model).__name__ == "ResNet" and not model.training
    assert model(torch.zeros(1, 1, 32, 32)).shape == (1, 10)
    other = model_digest(model, "timm:create_model", {"model_name": "resnet14t"})
    assert ctx.float_digest != other  # the arguments are part of the cache key


def test_a_factory_refusing_its_kwargs_is_named():
    with pytest.raises(StageError, match=r"torch.nn:Linear raised TypeError.*colour") as e:
        build_float("torch.nn:Linear", kwargs={"in_features": 3, "colour": 2})
    assert e.value.where == "model.factory"
    linear = build_float("torch.nn:Linear", kwargs={"in_features": 3, "out_features": 2})
    assert linear.weight.shape == (2, 3)


def test_two_batch_norms_reading_one_input_keep_their_own_ids():
    """LeViT's head and distillation head: BatchNorm1d on one input, then a linear each; the
    eval rewrite replaces both norms, and each must get its own module path back."""
    from torch import nn

    from stages.modelio import prepare_qat
    from stages.quantizer import QuantPolicy

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.linear = nn.BatchNorm1d(4), nn.Linear(4, 3)

        def forward(self, x):
            return self.linear(self.bn(x))

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.head, self.head_dist = Head(), Head()

        def forward(self, x):
            return (self.head(x) + self.head_dist(x)) / 2

    from stages.layers import ID_KEY, classify

    gm, _, _ = prepare_qat(TwoHeads().eval(), torch.randn(2, 4), QuantPolicy())
    ids = [n.meta.get(ID_KEY) for n in gm.graph.nodes if classify(n)[0] == "batch_norm"]
    assert sorted(ids) == ["head.bn", "head_dist.bn"]


def test_the_digest_covers_the_source_of_every_module_class_of_the_model(tmp_path, monkeypatch):
    """A ``forward`` edited in a helper module (not the factory's) changes the graph but no
    weight: the digest kept the old one, so the stage cache reused stale prepare results."""
    import importlib
    import sys

    (tmp_path / "helper_net.py").write_text(
        "import torch\nclass Block(torch.nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n"
    )
    (tmp_path / "net_factory.py").write_text(
        "import torch\nfrom helper_net import Block\n"
        "def build():\n    return torch.nn.Sequential(torch.nn.Linear(2, 2), Block())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("helper_net", "net_factory"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    torch.manual_seed(0)
    before = model_digest(importlib.import_module("net_factory").build(), "net_factory:build")
    helper = tmp_path / "helper_net.py"
    helper.write_text(helper.read_text().replace("relu", "sigmoid"))
    torch.manual_seed(0)
    assert (
        model_digest(importlib.import_module("net_factory").build(), "net_factory:build") != before
    )


def test_no_cache_keeps_a_prepared_model_alive():
    """torch's and torchao's device lookups cache every module prepare_pt2e shows them:
    the graphs traced from the float model (ResNet-50@224: 152 MB of weights) must not
    outlive the run that made them. torchvision's ShuffleNetV2 block, weakly referenced."""
    import gc
    import weakref

    from examples.zoo import libs
    from stages.modelio import prepare_qat
    from stages.quantizer import QuantPolicy

    block = libs.torchvision().models.shufflenetv2.InvertedResidual(8, 8, 1).eval()
    gm, _, _ = prepare_qat(block, torch.randn(2, 8, 8, 8), QuantPolicy())
    weight = weakref.ref(next(iter(gm.parameters())))
    del gm
    gc.collect()
    assert weight() is None, [r for r in gc.get_referrers(weight()) if not isinstance(r, list)]
