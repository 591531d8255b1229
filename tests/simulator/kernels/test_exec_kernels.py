"""The executor's requantize (float64 fast path and int64 path) against the reference."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.arith import intmath
from simulator.kernels import exec_kernels as ek
from tests.simulator.arith.test_kernels import rand_ints


@settings(max_examples=200, deadline=None)
@given(
    acc=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=40),
    mult=st.integers(1, 2**15 - 1),
    shift=st.integers(0, 40),
    mode=st.sampled_from(["half_even", "bpu_round"]),
    ties=st.booleans(),
)
def test_requant_equals_reference_including_ties(acc, mult, shift, mode, ties):
    a = np.array(acc, dtype=np.int64)
    if ties and shift > 0:  # make acc * mult land exactly on k + 0.5 steps
        mult = 1
        a = (a >> shift << shift) + (1 << (shift - 1))
    want = intmath.requantize(a, mult, shift, "int16", mode)
    got = ek.requant(
        torch.from_numpy(a), torch.tensor([mult]), torch.tensor([shift]), "int16", mode, None
    )
    assert got.tolist() == np.asarray(want).tolist()
    assert int(np.abs(a).max()) * mult < ek.FLOAT_EXACT  # the float64 path was taken


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32])
@pytest.mark.parametrize("axes", [(3,), (2, 3), (1, 2, 3), (1,), (0, 2), (0, 1, 2, 3)])
def test_sum_exact_equals_int64_sum(dt, axes):
    """Every branch (int8 GEMM with ones on trailing axes, float32 below 2**24, float64)
    on all-qmin / all-qmax / random data, keepdim or not, contiguous or a strided view."""
    rng = np.random.default_rng(len(axes))
    info = np.iinfo(dt)
    x = rand_ints(rng, (3, 70, 5, 9), dt)
    x[0], x[1, :35] = info.min, info.max
    t = torch.from_numpy(x)
    strided = t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # an NCHW view of NHWC
    for keep, v in [(True, t), (False, t), (True, strided), (False, strided)]:
        want = t.long().sum(dim=axes, keepdim=keep)
        got = ek.sum_exact(v, axes, keep)
        assert got.dtype == torch.float64 and got.shape == want.shape
        assert torch.equal(got.long(), want)
