"""Input-independent subgraphs become buffers: swin's shifted-window mask, as torchvision
builds it (``new_zeros`` then slice-by-slice in-place fills)."""

import torch
from torch import nn

from examples.zoo import libs
from stages.constant_fold import FOLDED_PREFIX, fold_constants
from stages.functionalize import functional_variant, out_of_place

shifted_window_attention = libs.torchvision().models.swin_transformer.shifted_window_attention


class ShiftedWindow(nn.Module):
    """One shifted-window attention call with torchvision's own function."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.randn(1, heads, 16, 16))
        self.heads = heads

    def forward(self, x):
        w = (self.qkv.weight, self.proj.weight, self.qkv.bias, self.proj.bias)
        return shifted_window_attention(
            x, w[0], w[1], self.bias, [4, 4], self.heads, [2, 2], 0.0, 0.0, w[2], w[3]
        )


def test_swin_mask_is_folded_and_the_graph_still_computes_the_same():
    torch.manual_seed(0)
    model = ShiftedWindow().eval()
    x = torch.randn(2, 8, 8, 8)
    ep = torch.export.export(
        model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},), strict=False
    )
    gm = ep.module()
    assert any(functional_variant(n) for n in gm.graph.nodes)  # the mask's fill_ calls
    folded = fold_constants(gm)
    assert folded
    assert not any(functional_variant(n) for n in gm.graph.nodes)
    assert any(str(n.target).startswith(FOLDED_PREFIX) for n in gm.graph.nodes)
    out_of_place(gm)  # nothing left to refuse
    torch.testing.assert_close(gm(x), model(x))
    x3 = torch.randn(3, 8, 8, 8)  # the batch stays dynamic
    torch.testing.assert_close(gm(x3), model(x3))


class ParamPath(nn.Module):
    """A parameter reshaped in forward: QAT trains it, so it must not be folded."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.w.reshape(1, 4)


def test_parameters_are_never_folded():
    ep = torch.export.export(ParamPath(), (torch.randn(2, 4),), strict=False)
    gm = ep.module()
    assert fold_constants(gm) == []
