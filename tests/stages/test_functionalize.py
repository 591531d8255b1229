"""In-place ops out of place, training-only randomness removed, on the field's own code.

The blocks come from torchvision as it ships (in-place ReLU, ``out += identity``,
stochastic depth); each rewritten graph must compute what the eager module computes in
eval mode, on the same input.
"""

import pytest
import torch
from torch import nn

from examples.zoo import libs
from schemas.errors import StageError
from stages.functionalize import (
    TRAINING_ONLY_KEY,
    functional_variant,
    out_of_place,
    remove_training_noise,
)
from stages.modelio import export_graph

_tv = libs.torchvision()  # the registry's wheel beside a CPU torch: examples/zoo/libs.py
BasicBlock = _tv.models.resnet.BasicBlock
StochasticDepth = _tv.ops.StochasticDepth

aten = torch.ops.aten


def _raw(model, x, mode="eval"):
    model.train(mode == "train")
    ep = torch.export.export(model, (x,), strict=False)
    return ep.module()


def _targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def test_torchvision_basic_block_loses_its_inplace_ops_and_keeps_its_values():
    torch.manual_seed(0)
    block = BasicBlock(8, 8).eval()
    x = torch.randn(2, 8, 6, 6)
    gm = _raw(block, x)
    assert {aten.relu_.default, aten.add_.Tensor} <= _targets(gm)
    assert out_of_place(gm) == 3  # two relu_, one add_
    assert not any(functional_variant(n) for n in gm.graph.nodes)
    assert {aten.relu.default, aten.add.Tensor} <= _targets(gm)
    torch.testing.assert_close(gm(x), block(x), rtol=0, atol=0)


class Reuse(nn.Module):
    """The mutated tensor is read again after the in-place op (must see the new value)."""

    def forward(self, x):
        y = x * 2.0
        y.relu_()
        return y + y.mean()


def test_later_reads_of_the_mutated_tensor_see_the_new_value():
    x = torch.randn(3, 5)
    gm = _raw(Reuse(), x)
    out_of_place(gm)
    torch.testing.assert_close(gm(x), Reuse()(x))


class ViewWrite(nn.Module):
    """relu_ on a slice, then the whole tensor is read: the write changes the base."""

    def forward(self, x):
        y = x * 1.0
        y[:, :2].relu_()
        return y * 3.0


def test_an_inplace_write_into_a_view_that_is_read_later_is_refused_by_layer():
    gm = _raw(ViewWrite(), torch.randn(2, 4))
    with pytest.raises(StageError, match="writes in place into a view"):
        out_of_place(gm)


class Residual(nn.Module):
    """torchvision's stochastic depth on a residual branch (as in EfficientNet, ConvNeXt)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.drop = StochasticDepth(0.5, "row")

    def forward(self, x):
        return x + self.drop(self.conv(x))


def test_stochastic_depth_in_a_train_trace_becomes_identity_and_is_listed():
    torch.manual_seed(0)
    model = Residual()
    x = torch.randn(4, 4, 5, 5)
    gm = _raw(model, x, mode="train")
    assert aten.bernoulli_.float in _targets(gm)
    removed = remove_training_noise(gm)
    assert len(removed) == 1 and "drop" in removed[0]
    assert not any("bernoulli" in str(t) or "empty" in str(t) for t in _targets(gm))
    first, second = gm(x), gm(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)  # deterministic
    torch.testing.assert_close(first, model.eval()(x))


def test_export_graph_applies_both_and_records_the_removed_randomness():
    model = Residual()
    gm = export_graph(model, torch.randn(2, 4, 5, 5), mode="train")
    assert gm.meta[TRAINING_ONLY_KEY]
    assert not any(functional_variant(n) for n in gm.graph.nodes)


class AddNoise(nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


def test_randomness_used_other_than_as_a_scale_is_refused_naming_the_op():
    gm = _raw(AddNoise(), torch.randn(2, 3))
    with pytest.raises(StageError, match="random values"):
        remove_training_noise(gm)


def test_timm_attention_unbind_becomes_selects_with_the_same_values():
    from timm.layers import Attention

    from stages.functionalize import unbind_to_select

    torch.manual_seed(0)
    attn = Attention(16, num_heads=2).eval()
    x = torch.randn(2, 5, 16)
    gm = _raw(attn, x)
    assert aten.unbind.int in _targets(gm)
    assert unbind_to_select(gm) == 1
    assert aten.unbind.int not in _targets(gm) and aten.select.int in _targets(gm)
    torch.testing.assert_close(gm(x), attn(x))


class NoiseFirst(nn.Module):
    """Dropout written by hand with the mask first (noise * x): also identity."""

    def forward(self, x):
        mask = torch.empty_like(x).bernoulli_(0.9) / 0.9
        return mask * x + 1.0


def test_a_noise_mask_on_either_side_of_a_product_is_dropped():
    x = torch.randn(3, 4)
    gm = _raw(NoiseFirst(), x, mode="train")
    assert len(remove_training_noise(gm)) == 1
    torch.testing.assert_close(gm(x), x + 1.0)


class MaskBias(nn.Module):
    """A text encoder's additive mask, ``(1 - mask) * -1e4``, and ``2 - 3 * x`` (alpha)."""

    def forward(self, mask, x):
        return (1 - mask) * -1e4 + torch.rsub(x, 2.0, alpha=3.0)


def test_rsub_becomes_add_of_a_product_with_the_same_values():
    from stages.functionalize import rsub_to_add

    mask, x = torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.randn(2, 3)
    gm = _raw_args(MaskBias(), (mask, x))
    assert aten.rsub.Scalar in _targets(gm)
    assert rsub_to_add(gm) == 2
    assert aten.rsub.Scalar not in _targets(gm)
    torch.testing.assert_close(gm(mask, x), MaskBias()(mask, x))
    assert gm(mask, x)[1, 2] < -9000  # still the int mask path: ints stay ints until the mul


def _raw_args(model, args):
    return torch.export.export(model.eval(), args, strict=False).module()
