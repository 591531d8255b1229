"""The compiled LayerNorm (simulator/csrc/qnorm.c) against composite.int_layernorm."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.arith import composite
from simulator.kernels import exec_dense, exec_native_norm
from simulator.runtime import native
from tests.simulator.arith.test_kernels import rand_ints
from tests.simulator.kernels.test_exec_dense import MODES, _extreme_rows

pytestmark = [pytest.mark.skipif(native.library() is None, reason=native.status()),
              pytest.mark.usefixtures("pool_threads")]  # conftest.py: 1 and 3 threads


def _native(q: np.ndarray, t):
    rsqrt = exec_dense.dense(t.rsqrt, torch.float64)
    return exec_native_norm.layernorm(torch.from_numpy(q), t, rsqrt, exec_dense.ln_affine(t))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 90), dt=st.sampled_from(["int8", "int16"]), mode=st.sampled_from(MODES),
       out=st.sampled_from(["int8", "int16"]), scale=st.sampled_from([0.02, 3e-4, 1.5]),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_native_layernorm_equals_composite(n, dt, mode, out, scale, seed):
    rng = np.random.default_rng(seed)
    t = composite.build_layernorm(scale, dt, 0.05, out, mode, n, 1e-5, rng.uniform(-2, 2, n),
                                  rng.normal(0, 0.3, n))  # fmt: skip
    q = rand_ints(rng, (3, 7, n), np.dtype(dt))  # a block of 16 rows and a part of one
    q[0, 0] = q[0, 0, :1]  # a constant row: variance eps only
    got = _native(q, t)
    rsqrt = exec_dense.dense(t.rsqrt, torch.float64)
    if got is None:  # a bound the torch path refuses too (a bias far beyond the weights)
        assert exec_dense.int_layernorm(torch.from_numpy(q), t, rsqrt) is None
        return
    np.testing.assert_array_equal(got.numpy(), composite.int_layernorm(q, t))


@pytest.mark.parametrize("n", [1, 2, 31, 1000, 1023])
@pytest.mark.parametrize("dt", ["int8", "int16"])
def test_native_layernorm_extremes(n, dt):
    """All-qmin, all-qmax, alternating and spiky rows up to the longest row it takes."""
    rng = np.random.default_rng(n)
    for mode in MODES:
        t = composite.build_layernorm(float(rng.choice([0.02, 3e-4])), dt, 0.05, "int16", mode,
                                      n, 1e-5, rng.uniform(-2, 2, n), rng.normal(0, 0.3, n))  # fmt: skip
        q = _extreme_rows(rng, 6, n, np.dtype(dt))
        np.testing.assert_array_equal(_native(q, t).numpy(), composite.int_layernorm(q, t))


def test_long_rows_and_broken_bounds_are_left_to_the_torch_path():
    n = 1024
    t = composite.build_layernorm(0.02, "int8", 0.05, "int8", "half_even", n, 1e-5,
                                  np.ones(n), np.zeros(n))  # fmt: skip
    assert _native(rand_ints(np.random.default_rng(1), (2, n), np.int8), t) is None
    n = 8  # a huge bias: y * w * M + b * M passes 2**52 (int_layernorm refuses it too)
    t = composite.build_layernorm(0.02, "int8", 0.05, "int8", "half_even", n, 1e-5,
                                  np.ones(n), np.full(n, 1e6))  # fmt: skip
    assert _native(rand_ints(np.random.default_rng(0), (2, n), np.int8), t) is None


def test_the_runtime_bound_on_y_is_checked_in_the_kernel():
    """``max|y| <= y_top`` fails on the data: None (the caller then runs the reference)."""
    n = 16
    t = composite.build_layernorm(0.02, "int8", 0.05, "int8", "bpu_round", n, 1e-5,
                                  np.ones(n), np.zeros(n))  # fmt: skip
    q = torch.from_numpy(rand_ints(np.random.default_rng(2), (5, n), np.int8))
    rsqrt = exec_dense.dense(t.rsqrt, torch.float64)
    wm, bm, y_top = exec_dense.ln_affine(t)
    assert exec_native_norm.layernorm(q, t, rsqrt, (wm, bm, y_top)) is not None
    assert exec_native_norm.layernorm(q, t, rsqrt, (wm, bm, 0)) is None


@pytest.mark.parametrize("mode", MODES)
def test_mean_and_variance_ties(mode):
    """int16 rows of two values with odd sums (the mean is a tie), both signs."""
    n = 2
    t = composite.build_layernorm(3e-4, "int16", 0.05, "int16", mode, n, 1e-5,
                                  np.ones(n), np.zeros(n))  # fmt: skip
    assert t.in_shift == 0  # the sums are the raw integers: x1 / 2 ties on odd sums
    a = np.arange(-9, 10, dtype=np.int16)
    q = np.stack([a, a + 1], axis=1)  # sums 2a + 1: every one a tie
    np.testing.assert_array_equal(_native(q, t).numpy(), composite.int_layernorm(q, t))


def _native_softmax(q: np.ndarray, t, axis: int = -1):
    qt = torch.from_numpy(q)
    exp = exec_dense.exp_of_gap(t, qt.dtype)
    return exec_native_norm.softmax(qt, axis, t, exp, exec_dense.dense(t.recip, torch.float64))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 70), dt=st.sampled_from(["int8", "int16"]), mode=st.sampled_from(MODES),
       out=st.sampled_from(["int8", "int16"]), in_scale=st.sampled_from([1e-4, 1e-3, 0.05]),
       out_scale=st.sampled_from([1 / 255, 2**-15]), seed=st.integers(0, 2**31))  # fmt: skip
def test_native_softmax_equals_composite(n, dt, mode, out, in_scale, out_scale, seed):
    """Rows across the 16-lane chunks; near-equal rows make ties in the sums frequent."""
    rng = np.random.default_rng(seed)
    t = composite.build_softmax(in_scale, "int16", out_scale, out, mode, n)
    q = rand_ints(rng, (3, 7, n), np.dtype(dt))  # short rows: a block of 16 and a part
    q[0] = rng.integers(-3, 3, (7, n))
    got = _native_softmax(q, t)
    assert got is not None and got.dtype == getattr(torch, out)
    np.testing.assert_array_equal(got.numpy().astype(np.int64), composite.int_softmax(q, -1, t))


@pytest.mark.parametrize("n", [2, 16, 17, 300])
@pytest.mark.parametrize("dt", ["int8", "int16"])
def test_native_softmax_extremes(n, dt):
    """All-qmin, all-qmax, alternating (the widest gaps) and spiky rows, both modes."""
    rng = np.random.default_rng(n)
    for mode in MODES:
        t = composite.build_softmax(2e-3, "int16", 2**-15, "int16", mode, n)
        q = _extreme_rows(rng, 21, n, np.dtype(dt))
        got = _native_softmax(q, t)
        np.testing.assert_array_equal(got.numpy().astype(np.int64), composite.int_softmax(q, -1, t))


def test_softmax_off_the_last_axis_or_wide_is_left_to_the_torch_path():
    t = composite.build_softmax(2e-3, "int16", 2**-15, "int16", "half_even", 4)
    q = rand_ints(np.random.default_rng(2), (4, 4), np.int8)
    assert _native_softmax(q, t, axis=0) is None
    assert _native_softmax(q.astype(np.int32), t) is None


@pytest.mark.parametrize("dt", ["int8", "int16"])
def test_native_layernorm_tiny_variances(dt):
    """Rows of 0/1 and 0/2 values with an eps of 0: variances from 0 up through every small
    power of two, so the normalizing exponent k = (e - 14) >> 1 is negative and odd and
    even (floor, not truncation), on rows whose deviations are not all zero."""
    rng = np.random.default_rng(7)
    for n in (3, 8, 33):
        t = composite.build_layernorm(1.5, dt, 0.05, "int16", "half_even", n, 0.0,
                                      rng.uniform(-2, 2, n), rng.normal(0, 0.3, n))  # fmt: skip
        q = (rng.random((64, n)) < np.linspace(0.02, 0.5, 64)[:, None]).astype(dt)
        q[32:] *= 2
        got = _native(q, t)
        assert got is not None
        np.testing.assert_array_equal(got.numpy(), composite.int_layernorm(q, t))
