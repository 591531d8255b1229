"""Attention and einsum written out as the ops the chain quantizes (stages/decompose.py)."""

import pytest
import torch
import torch.nn.functional as F

from stages.decompose import SDPA, _matmul_plan
from stages.modelio import export_graph


@pytest.mark.parametrize(
    ("equation", "plan"),
    [
        ("bij,bjk->bik", (False, False)),
        ("bhqd,bhkd->bhqk", (False, True)),  # q @ k^T
        ("bji,bjk->bik", (True, False)),
        ("ij,jk->ik", (False, False)),
        ("nchw,nchw->nhw", None),  # a reduction, no matrix product
        ("bij,bji->bii", None),  # a diagonal
        ("bij,bjk->bki", None),  # a transposed result
        ("...ij,...jk->...ik", None),
    ],
)
def test_an_einsum_is_a_matmul_only_when_it_is_a_batched_matrix_product(equation, plan):
    assert _matmul_plan(equation, 2) == plan


class _Attention(torch.nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, x):
        q, k, v = x, x * 0.5, -x
        mask = x[0, 0, :, :1] * 0.1  # an additive float mask, broadcast
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if self.causal else mask,
                                              is_causal=self.causal)  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_is_written_out_unless_causal_and_computes_the_same(causal):
    x = torch.randn(2, 2, 6, 4)
    gm = export_graph(_Attention(causal), x)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert (SDPA in targets) == causal
    assert causal or {torch.ops.aten.softmax.int, torch.ops.aten.matmul.default} <= targets
    torch.testing.assert_close(gm(x), _Attention(causal)(x), rtol=1e-5, atol=1e-6)
