"""Integer softmax and layer norm against float, and numpy/torch agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from simulator.arith import composite as c
from simulator.arith import fixedpoint as fp

FAST = settings(max_examples=40, deadline=None)
MODES = st.sampled_from(fp.ROUNDING_MODES)


def _rows(rng, dtype, amax, shape):
    """Quantized rows with a spread of amplitudes (some nearly constant)."""
    x = rng.normal(0, amax / 4, shape) * rng.uniform(0.01, 1, shape[:-1] + (1,))
    return fp.quantize(x.clip(-amax, amax), fp.symmetric_scale(amax, dtype), dtype, "bpu_round")


SOFTMAX_CASES = [  # (in dtype, in amax, row length, out dtype); int16 d = q - max(q)
    ("int8", 8, 10, "int16"),  # saturates at -amax, which is harmless once exp(-amax) < 2^-17
    ("int8", 8, 10, "int8"),
    ("int16", 12, 16, "int16"),
    ("int16", 12, 100, "int16"),
    ("int8", 16, 197, "int8"),
    ("int8", 8, 1, "int8"),  # one element (levit's attention over one token): always 1
]


@pytest.mark.parametrize("in_dtype,amax,n,out_dtype", SOFTMAX_CASES)
@pytest.mark.parametrize("mode", fp.ROUNDING_MODES)
def test_int_softmax_close_to_float(in_dtype, amax, n, out_dtype, mode):
    """Bound: 2^(sum_shift-16) (reciprocal input step, relative) + 4 * 2^-15 (exp and
    reciprocal tables, <= 2 steps each) + half an output step."""
    rng = np.random.default_rng(n)
    q = _rows(rng, in_dtype, amax, (64, n))
    s_in, s_out = fp.symmetric_scale(amax, in_dtype), fp.symmetric_scale(1.0, out_dtype)
    t = c.build_softmax(s_in, in_dtype, s_out, out_dtype, mode, n)
    out = c.int_softmax(q, -1, t)
    want = torch.softmax(torch.from_numpy(q * s_in), -1).numpy()
    bound = 2.0 ** (t.sum_shift - 16) + 4 * 2.0**-15 + 0.5 * s_out
    assert np.abs(out * s_out - want).max() <= bound
    assert np.abs((out * s_out).sum(-1) - 1).max() <= 2.0 ** (t.sum_shift - 16) + n * bound
    assert np.array_equal(c.int_softmax(torch.from_numpy(q), -1, t).numpy(), out)


@FAST
@given(
    q=hnp.arrays(
        np.int64,
        st.tuples(st.integers(1, 4), st.integers(1, 12)),
        elements=st.integers(-32768, 32767),
    ),  # fmt: skip
    shift=st.integers(-100, 100),
    mode=MODES,
    axis=st.sampled_from([0, 1, -1]),
)
def test_int_softmax_properties(q, shift, mode, axis):
    t = c.build_softmax(1e-3, "int16", 2.0**-15, "int16", mode, 16)
    out = c.int_softmax(q, axis, t)
    assert out.dtype == np.int64 and out.shape == q.shape
    assert out.min() >= 0 and out.max() <= 32767
    assert np.array_equal(c.int_softmax(torch.from_numpy(q), axis, t).numpy(), out)
    moved = np.clip(q + shift, -32768, 32767)
    if np.array_equal(moved - shift, q):  # no saturation: only differences matter
        assert np.array_equal(c.int_softmax(moved, axis, t), out)


LN_CASES = [("int16", 8, 64, 6), ("int8", 8, 64, 6), ("int16", 2, 768, 8), ("int8", 4, 16, 4)]


@pytest.mark.parametrize("in_dtype,amax,n,omax", LN_CASES)
@pytest.mark.parametrize("out_dtype", ["int8", "int16"])
def test_int_layernorm_close_to_float(in_dtype, amax, n, omax, out_dtype):
    """Bound per row: max|w| * (0.5 / sigma + 2e-4 * max|y|) + out_scale, where sigma is
    the row's std in internal integer steps (the integer mean is off by <= 0.5 step) and
    2e-4 covers the rsqrt LUT and the 2^-16 normalized value."""
    rng = np.random.default_rng(n)
    q = _rows(rng, in_dtype, amax, (64, n))
    w, b = rng.uniform(0.5, 1.5, n), rng.normal(0, 0.3, n)
    s_in, s_out = fp.symmetric_scale(amax, in_dtype), fp.symmetric_scale(omax, out_dtype)
    t = c.build_layernorm(s_in, in_dtype, s_out, out_dtype, "bpu_round", n, 1e-5, w, b)
    out = c.int_layernorm(q, t)
    x = torch.from_numpy(q * s_in)
    want = torch.nn.functional.layer_norm(x, (n,), torch.from_numpy(w), torch.from_numpy(b), 1e-5)
    lo, hi = fp.qrange(out_dtype)
    err = np.abs(out * s_out - want.numpy().clip(lo * s_out, hi * s_out)).max(-1)
    sigma = (q * 2**t.in_shift).std(-1)
    y = np.abs(torch.nn.functional.layer_norm(x, (n,), eps=1e-5).numpy()).max(-1)
    assert np.all(err <= w.max() * (0.5 / sigma + 2e-4 * y) + s_out)
    assert np.array_equal(c.int_layernorm(torch.from_numpy(q), t).numpy(), out)


def test_layernorm_constant_rows_give_bias_and_defaults_work():
    n = 8
    t = c.build_layernorm(
        0.01, "int8", 0.01, "int8", "half_even", n, 1e-5, None, np.arange(n) / 100
    )
    out = c.int_layernorm(np.full((3, n), 17), t)
    assert out.tolist() == [list(range(n))] * 3
    t = c.build_layernorm(0.01, "int8", 0.01, "int8", "half_even", n, 1e-5)
    q = np.arange(-4, 4)[None]
    want = torch.nn.functional.layer_norm(torch.from_numpy(q * 0.01), (n,), eps=1e-5)
    assert np.abs(c.int_layernorm(q, t) * 0.01 - want.numpy().clip(-1.28, 1.27)).max() <= 0.0051


@FAST
@given(v=hnp.arrays(np.int64, st.integers(1, 30), elements=st.integers(1, 2**45)), mode=MODES)
def test_normalize_var_range(v, mode):
    vn, k = c._normalize_var(v, mode)
    assert np.all((vn >= 2**13) & (vn <= 32767))
    assert np.all(
        np.abs(vn * 4.0**k - v) <= np.maximum(4.0**k, 1) / 2 + 4.0**k
    )  # rounding/saturation
