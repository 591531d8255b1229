"""Float epilogues and dense tables against the slow, obvious integer references
(intmath.requantize, int_ops.qadd, lut.lookup, composite.int_softmax / int_layernorm)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.arith import composite, intmath
from simulator.arith.int_ops import qadd
from simulator.arith.lut import build_direct_table, build_segmented_table, lookup
from simulator.kernels import exec_dense
from simulator.kernels.exec_epilogue import add_epilogue, epilogue
from simulator.kernels.exec_kernels import FLOAT_EXACT
from tests.simulator.arith.test_kernels import rand_ints

MODES = ("half_even", "bpu_round")


@settings(max_examples=200, deadline=None)
@given(
    acc=st.lists(st.integers(-(2**24), 2**24), min_size=1, max_size=30),
    bias=st.integers(-(2**20), 2**20),
    mult=st.integers(1, 2**15 - 1),
    shift=st.integers(0, 40),
    mode=st.sampled_from(MODES),
    out=st.sampled_from(["int8", "int16", "int32"]),
    relu=st.booleans(),
    ties=st.booleans(),
)
def test_epilogue_equals_requantize(acc, bias, mult, shift, mode, out, relu, ties):
    """``clamp(round_div((acc + bias) * m, 2**s))`` then relu, ties included."""
    a = np.array(acc, dtype=np.int64)
    if ties and shift > 0:  # (acc + bias) * mult lands exactly on k + 1/2 steps
        mult, a = 1, (a >> shift << shift) + (1 << (shift - 1)) - bias
    want = intmath.requantize(a + bias, mult, shift, out, mode)
    want = np.maximum(want, 0) if relu else want
    epi = epilogue({"out_dtype": out, "relu": int(relu), "rounding": mode},
                   torch.tensor([bias]), torch.tensor([mult]), torch.tensor([shift]))  # fmt: skip
    assert (2**25 + 2**20) * mult < FLOAT_EXACT  # inside the proven bound
    got = epi.apply(torch.from_numpy(a).reshape(-1, 1))
    assert got.reshape(-1).tolist() == np.asarray(want).tolist()


@pytest.mark.parametrize("seed", range(10))
def test_add_epilogue_equals_qadd(seed):
    """float32 (small multipliers) and float64 paths of QAdd, per-channel and scalar."""
    rng = np.random.default_rng(seed)
    dt_a, dt_b = [(np.int8, np.int8), (np.int8, np.int16), (np.int16, np.int32)][seed % 3]
    a, b = rand_ints(rng, (2, 3, 4, 5), dt_a), rand_ints(rng, (2, 3, 4, 5), dt_b)
    top = [2**7, 2**14][seed % 2]
    ma = rng.integers(-top, top, (3, 1, 1)) if seed % 4 < 2 else rng.integers(1, top, (1,))
    mb, sh = rng.integers(-top, top, (1,)), np.array([int(rng.integers(0, 20))])
    attrs = {"out_dtype": str(rng.choice(["int8", "int16"])), "relu": seed % 2,
             "rounding": MODES[seed % 2]}  # fmt: skip
    want = qadd([a, b, ma, mb, sh], attrs)
    t = [torch.from_numpy(v) for v in (a, b, ma, mb, sh)]
    epi = add_epilogue(attrs, t[0].dtype, t[1].dtype, *t[2:])
    assert epi is not None
    bound = -np.iinfo(dt_a).min * np.abs(ma).max() - np.iinfo(dt_b).min * np.abs(mb).max()
    assert (epi.ftype == torch.float32) == (bound < 2 ** (24 - (attrs["rounding"] != "half_even")))
    np.testing.assert_array_equal(epi.apply(t[0], t[1]).numpy(), want)


def _all_ints(dtype: str) -> torch.Tensor:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    return torch.arange(lo, hi + 1, dtype=getattr(torch, dtype))


@pytest.mark.parametrize("mode", MODES)
def test_dense_table_is_lookup_on_every_input(mode):
    seg = build_segmented_table("tanh", np.tanh, 2e-4, 2**-15, "int16", mode, segments=6)
    q = _all_ints("int16")
    d = exec_dense.dense(seg)
    assert torch.equal(d(q), lookup(seg, q))
    wide = torch.tensor([-(2**20), -32769, 32768, 2**20], dtype=torch.int32)  # saturates
    assert torch.equal(d(wide), lookup(seg, wide))
    direct = build_direct_table(
        "exp", np.exp(np.arange(-128, 128) * 0.02), 0.02, 0.05, "int8", mode
    )
    d8 = exec_dense.dense(direct, torch.int8)
    assert torch.equal(d8(_all_ints("int8")), lookup(direct, _all_ints("int8")).to(torch.int8))


@pytest.mark.parametrize("seed", range(8))
def test_dense_softmax_equals_composite(seed):
    rng = np.random.default_rng(seed)
    mode, n = MODES[seed % 2], int(rng.integers(1, 70))
    t = composite.build_softmax(float(rng.choice([1e-4, 1e-3, 0.05])), "int16",
                                float(rng.choice([1 / 255, 2**-15])),
                                str(rng.choice(["int8", "int16"])), mode, n)  # fmt: skip
    q = rand_ints(rng, (3, n, 4), np.int16)
    q[0] = rng.integers(-3, 3, (n, 4))  # near-equal rows: ties in the sums
    axis = int(rng.choice([1, -1, 0]))
    want = composite.int_softmax(q, axis, t)
    exp = exec_dense.exp_of_gap(t, torch.int16)
    recip = exec_dense.dense(t.recip, torch.float64)
    got = exec_dense.int_softmax(torch.from_numpy(q), axis, t, exp, recip)
    np.testing.assert_array_equal(got.numpy().astype(np.int64), want)
    strided = torch.from_numpy(q.transpose(1, 0, 2).copy()).transpose(0, 1)  # a reshape's view
    got = exec_dense.int_softmax(strided, axis, t, exp, recip)
    np.testing.assert_array_equal(got.numpy().astype(np.int64), want)


@pytest.mark.parametrize("seed", range(8))
def test_dense_layernorm_equals_composite(seed):
    rng = np.random.default_rng(seed)
    mode, n, dt = MODES[seed % 2], int(rng.integers(1, 80)), ["int8", "int16"][seed // 2 % 2]
    t = composite.build_layernorm(float(rng.choice([0.02, 3e-4])), dt, 0.05, "int8", mode, n,
                                  1e-5, rng.uniform(-2, 2, n), rng.normal(0, 0.3, n))  # fmt: skip
    q = rand_ints(rng, (4, 3, n), np.dtype(dt))
    q[0, 0] = q[0, 0, :1]  # a constant row: variance eps only, small normalized shift
    want = composite.int_layernorm(q, t)
    rsqrt = exec_dense.dense(t.rsqrt, torch.float64)
    got = exec_dense.int_layernorm(torch.from_numpy(q), t, rsqrt)
    np.testing.assert_array_equal(got.numpy(), want)


def test_dense_layernorm_refuses_beyond_the_float64_bound():
    """A huge bias makes ``z * out_mult`` pass 2**52: None, and the executor falls back."""
    n = 8
    t = composite.build_layernorm(0.02, "int8", 0.05, "int8", "half_even", n, 1e-5,
                                  np.ones(n), np.full(n, 1e6))  # fmt: skip
    q = torch.from_numpy(rand_ints(np.random.default_rng(0), (2, n), np.int8))
    assert exec_dense.int_layernorm(q, t, exec_dense.dense(t.rsqrt, torch.float64)) is None


@settings(max_examples=100, deadline=None)
@given(
    v=st.lists(st.integers(0, 2**42), min_size=1, max_size=20),
    powers=st.lists(st.integers(0, 42), max_size=6),
    mode=st.sampled_from(MODES),
)
def test_normalize_var_by_exponent_equals_composite(v, powers, mode):
    """bit_length from frexp == composite's count of ``v >= 2**j``, at powers of two too."""
    vals = torch.tensor(v + [1 << p for p in powers] + [(1 << p) - 1 for p in powers])
    want_vn, want_k = composite._normalize_var(vals, mode)
    got_vn, got_k = exec_dense._normalize_var(vals, mode)
    assert torch.equal(got_vn, want_vn) and torch.equal(got_k, want_k)


def _extreme_rows(rng, rows: int, n: int, dt) -> np.ndarray:
    """Rows of every awkward kind: all qmin, all qmax, alternating qmin/qmax, one spike,
    constant, random."""
    info = np.iinfo(dt)
    q = rand_ints(rng, (rows, n), dt)
    q[0], q[1] = info.min, info.max
    q[2, 0::2], q[2, 1::2] = info.min, info.max
    q[3], q[3, 0] = 0, info.max
    q[4] = int(rng.integers(info.min, info.max))
    return q


@pytest.mark.parametrize("n", [1, 2, 31, 1023, 1024, 2047, 2048, 2500])
@pytest.mark.parametrize("dt", ["int8", "int16"])
def test_dense_layernorm_extremes_and_row_lengths(n, dt):
    """Extreme rows, both sides of the float32-moments limit (int8, n = 1023 / 1024) and of
    :data:`exec_dense.LN_ROWS_MAX` (the int64 steps for n >= 2048), both modes."""
    rng = np.random.default_rng(n)
    for mode in MODES:
        scale = float(rng.choice([0.02, 3e-4]))
        w, b = rng.uniform(-2, 2, n), rng.normal(0, 0.3, n)
        t = composite.build_layernorm(scale, dt, 0.05, "int16", mode, n, 1e-5, w, b)
        q = _extreme_rows(rng, 6, n, np.dtype(dt))
        got = exec_dense.int_layernorm(
            torch.from_numpy(q), t, exec_dense.dense(t.rsqrt, torch.float64)
        )
        np.testing.assert_array_equal(got.numpy(), composite.int_layernorm(q, t))


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32])
@pytest.mark.parametrize("mode", MODES)
def test_dense_softmax_every_input_dtype(dt, mode):
    """int8 / int16 gaps index the full table; int32 gaps (up to 2**32) are clamped."""
    rng = np.random.default_rng(3)
    n = 17
    t = composite.build_softmax(2e-3, "int16", 2**-15, "int16", mode, n)
    q = _extreme_rows(rng, 6, n, dt)
    want = composite.int_softmax(q, -1, t)
    exp = exec_dense.exp_of_gap(t, torch.from_numpy(q).dtype)
    got = exec_dense.int_softmax(
        torch.from_numpy(q), -1, t, exp, exec_dense.dense(t.recip, torch.float64)
    )
    np.testing.assert_array_equal(got.numpy().astype(np.int64), want)


@pytest.mark.parametrize("n", [1, 5, 32, 1023, 1024, 2047])
@pytest.mark.parametrize("dt", ["int8", "int16"])
def test_layernorm_row_stats_equal_the_integer_steps(n, dt):
    """``mean`` and ``v`` from the two float reductions equal composite's int64 steps
    (``round_div(sum(x), n)``, ``round_div(sum(d^2) << 9, n) + eps_fx``) exactly."""
    rng = np.random.default_rng(n)
    for mode in MODES:
        t = composite.build_layernorm(3e-4, dt, 0.05, "int8", mode, n, 1e-5)
        q = _extreme_rows(rng, 8, n, np.dtype(dt))
        x = q.astype(np.int64) << t.in_shift
        mean = intmath.round_div(x.sum(-1, keepdims=True), n, mode)
        ssd = ((x - mean) ** 2).sum(-1, keepdims=True)
        v = intmath.round_div(ssd << composite.VAR_GUARD, n, mode) + t.eps_fx
        _, got_mean, got_v = exec_dense._row_stats(torch.from_numpy(q), t)
        np.testing.assert_array_equal(got_mean.numpy(), mean)
        np.testing.assert_array_equal(got_v.numpy(), v)
