"""The float shortcuts of simulator/kernels/exec_epilogue.py against the integer references:
``round_quotient`` == ``intmath.round_div``, ``pow2`` == ``2.0**e``, and the int32
``gemm_epilogue`` (``int_bias``) == saturating ``acc + bias``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.arith import intmath
from simulator.kernels import exec_kernels as ek
from simulator.kernels.exec_epilogue import (
    INT32,
    QUOTIENT_EXACT,
    gemm_epilogue,
    pow2,
    round_,
    round_quotient,
    scaled_epilogue,
)
from tests.simulator.arith.test_kernels import rand_ints

MODES = ("half_even", "bpu_round")
TOP = QUOTIENT_EXACT - 1


@settings(max_examples=300, deadline=None)
@given(
    a=st.lists(st.integers(-TOP, TOP), min_size=1, max_size=20),
    n=st.integers(1, 2**45),
    mode=st.sampled_from(MODES),
    near=st.integers(-3, 3),
)
def test_round_quotient_equals_round_div(a, n, mode, near):
    """Random numerators, the extremes, exact ties ``(2k + 1) n / 2`` and their neighbours
    (``near``), for divisors up to 2**45 (LayerNorm's n, reduce_mean's ``n << shift``)."""
    vals = list(a) + [TOP, -TOP, 0, near]
    if n % 2 == 0:
        for k in (0, 1, -1, TOP // n - 1, -(TOP // n)):
            tie = (2 * k + 1) * (n // 2)
            vals += [v for v in (tie + near, tie - near) if abs(v) <= TOP]
    v = torch.tensor(vals, dtype=torch.int64)
    want = intmath.round_div(v, n, mode)
    got = round_quotient(v.double(), n, mode)
    assert torch.equal(got.long(), want)


def test_round_quotient_needs_the_bound():
    """Near 2**53 the float quotient is no longer enough: some numerator over 3 rounds
    differently, which is why callers check the bound."""
    v = torch.arange(2**53 - 3000, 2**53, dtype=torch.int64)
    got = round_quotient(v.double(), 3, "half_even").long()
    assert not torch.equal(got, intmath.round_div(v, 3, "half_even"))


def test_pow2_is_exact_for_every_exponent():
    e = torch.arange(-1022, 1024)
    got = pow2(e)
    assert got.dtype == torch.float64
    assert got.tolist() == [2.0**i for i in range(-1022, 1024)]


@pytest.mark.parametrize("seed", range(6))
def test_int32_gemm_epilogue_adds_bias_in_int32(seed):
    """int32 output, no requantize: ``acc + bias`` in place when ``acc_bound < 2**31``
    (relu too), equal to the int64 saturating reference; above the bound, float64."""
    rng = np.random.default_rng(seed)
    k, o = int(rng.integers(1, 200)), int(rng.integers(1, 9))
    w = torch.from_numpy(rand_ints(rng, (k, o), np.int8))
    bias = torch.from_numpy(rng.integers(-(2**20), 2**20, o))
    attrs = {"out_dtype": "int32", "relu": seed % 2, "rounding": MODES[seed % 2]}
    empty = torch.zeros(0, dtype=torch.int64)
    epi = gemm_epilogue(attrs, w, torch.int8, bias, empty, empty)
    assert epi is not None and epi.int_bias is not None
    x = torch.from_numpy(rand_ints(rng, (50, k), np.int8))
    x[0] = torch.where(w[:, 0] < 0, -128, 127)  # the extreme accumulator of column 0
    acc = torch._int_mm(x, w)
    want = (acc.long() + bias).clamp(*INT32)
    want = want.clamp(min=0) if seed % 2 else want
    got = epi.apply(acc.clone())
    assert got.dtype == torch.int32 and torch.equal(got.long(), want)
    huge = torch.full((o,), 2**31 - 1, dtype=torch.int64)  # bound above int32: float64 path
    epi64 = gemm_epilogue(attrs, w, torch.int8, huge, empty, empty)
    assert epi64.int_bias is None
    want64 = (acc.long() + huge).clamp(*INT32)
    want64 = want64.clamp(min=0) if seed % 2 else want64
    assert torch.equal(epi64.apply(acc).long(), want64)


@settings(max_examples=200, deadline=None)
@given(
    v=st.lists(st.integers(-(2**23), 2**23), min_size=1, max_size=20),
    mult=st.integers(1, 2**15 - 1),
    shift=st.integers(0, 40),
    mode=st.sampled_from(MODES),
    out=st.sampled_from(["int8", "int16", "int32"]),
    ties=st.booleans(),
)
def test_scaled_epilogue_float32_and_float64_equal_requantize(v, mult, shift, mode, out, ties):
    """``req(v, m, s)`` through :func:`scaled_epilogue`: float32 when ``bound * m`` is below
    2**24 (half_even) / 2**23 (bpu_round), bound = max|v| here; float64 otherwise; ties
    ``(2k + 1) 2**(s - 1) / m`` included."""
    a = np.array(v, dtype=np.int64)
    if ties and shift > 0:
        mult, a = 1, (a >> shift << shift) + (1 << (shift - 1))
    bound = int(np.abs(a).max()) + 1
    attrs = {"out_dtype": out, "relu": 0, "rounding": mode}
    epi = scaled_epilogue(attrs, bound, torch.tensor([mult]), torch.tensor([shift]), _one)
    assert epi is not None
    assert (epi.ftype == torch.float32) == (bound * mult < 2 ** (24 - (mode != "half_even")))
    want = intmath.requantize(a, mult, shift, out, mode)
    dtype = torch.int32 if bound < 2**31 else torch.int64
    got = epi.apply(torch.from_numpy(a).to(dtype))
    assert got.tolist() == np.asarray(want).tolist()


def _one(v: torch.Tensor) -> tuple[int, ...]:
    return ()


@pytest.mark.parametrize("mode", MODES)
def test_bpu_round_needs_the_spare_bit(mode):
    """``|v m|`` just below 2**53 with a shift of 54: ``|y| + 0.5`` is not exact there
    (round_ alone gives 1 for ``(2**53 - 1) 2**-54``), so the bounds stop at 2**52 and
    ``ek.requant`` takes the int64 path; likewise float32 stops at 2**23 (``8388615 + 0.5``
    is not a float32). half_even has no ``+ 0.5``: its limits are 2**53 and 2**24."""
    y = torch.tensor([(2**53 - 1) * 2.0**-54])
    if mode == "bpu_round":
        assert round_(y.clone(), mode).item() == 1.0  # the hole the bound avoids
    acc = torch.tensor([2**53 - 1, -(2**53 - 1), 2**52 - 1, 2**52 + 1], dtype=torch.int64)
    for shift in (0, 1, 53, 54, 60):
        want = intmath.requantize(acc.numpy(), 1, shift, "int32", mode)
        got = ek.requant(acc, torch.tensor([1]), torch.tensor([shift]), "int32", mode, None)
        assert got.tolist() == np.asarray(want).tolist()
    a = torch.tensor([8388615, -8388615, 4194303], dtype=torch.int32)
    attrs = {"out_dtype": "int32", "relu": 0, "rounding": mode}
    epi = scaled_epilogue(attrs, 2**23, torch.tensor([1]), torch.tensor([0]), _one)
    want_f32 = mode == "half_even"  # 2**23 is below 2**24 (half_even), not below 2**23
    assert (epi.ftype == torch.float32) == want_f32
    want = intmath.requantize(a.long().numpy(), 1, 0, "int32", mode)
    assert epi.apply(a).tolist() == np.asarray(want).tolist()
