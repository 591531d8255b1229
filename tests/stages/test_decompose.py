"""Attention and einsum written out as the ops the chain quantizes (stages/decompose.py)."""

import pytest

from stages.decompose import _matmul_plan


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
