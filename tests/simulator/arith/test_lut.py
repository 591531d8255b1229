"""Lookup tables against a slow per-element Python-int reference, and their accuracy."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith import intmath, lut
from tests.simulator.arith.test_fixedpoint import ref_round

FAST = settings(max_examples=60, deadline=None)
MODES = st.sampled_from(fp.ROUNDING_MODES)
DTYPES = st.sampled_from(["int8", "int16"])


def _np_fn(torch_fn):
    return lambda x: torch_fn(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()


FNS = {
    "sigmoid": _np_fn(torch.sigmoid),
    "tanh": _np_fn(torch.tanh),
    "gelu": _np_fn(torch.nn.functional.gelu),
    "silu": _np_fn(torch.nn.functional.silu),
    "exp": np.exp,
    "reciprocal": lambda x: 1.0 / x,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
}


def ref_lookup(t: lut.LutTable, q: int) -> int:
    """The table evaluated for one integer with Python ints and exact rationals."""
    qmin, qmax = fp.qrange(t.in_dtype)
    q = min(max(int(q), qmin), qmax)
    if t.kind == "direct":
        return int(t.entries[q - qmin])
    b, e = t.bounds.tolist(), t.entries.tolist()
    m, s, f_bits, mode = t.mults.tolist(), t.shifts.tolist(), t.frac_bits, t.rounding
    k_last, n = len(b) - 2, len(e[0])
    if q < b[0]:
        v = e[0][0] + ref_round(
            Fraction((e[0][1] - e[0][0]) * (q - b[0]) * m[0], 2 ** (s[0] + f_bits)), mode
        )
    elif q > b[-1]:
        d = e[-1][-1] - e[-1][-2]
        v = e[-1][-1] + ref_round(Fraction(d * (q - b[-1]) * m[-1], 2 ** (s[-1] + f_bits)), mode)
    else:
        k = max(j for j in range(k_last + 1) if b[j] <= q)
        pos = ref_round(Fraction((q - b[k]) * m[k], 2 ** s[k]), mode)
        pos = min(max(pos, 0), (n - 1) * 2**f_bits)
        i = min(pos // 2**f_bits, n - 2)
        frac = pos - i * 2**f_bits
        v = e[k][i] + ref_round(Fraction((e[k][i + 1] - e[k][i]) * frac, 2**f_bits), mode)
    lo, hi = fp.qrange(t.out_dtype)
    return min(max(v, lo), hi)


@st.composite
def random_tables(draw):
    """Hand-made segmented tables: arbitrary entries, bounds, multipliers and shifts."""
    in_dtype, out_dtype, mode = draw(DTYPES), draw(DTYPES), draw(MODES)
    qmin, qmax = fp.qrange(in_dtype)
    k, n = draw(st.integers(1, 8)), draw(st.integers(2, 64))
    b = sorted(draw(st.sets(st.integers(qmin, qmax), min_size=k + 1, max_size=k + 1)))
    lo, hi = fp.qrange(out_dtype)
    e = draw(st.lists(st.integers(lo, hi), min_size=k * n, max_size=k * n))
    m = draw(st.lists(st.integers(1, 2**16 - 1), min_size=k, max_size=k))
    s = draw(st.lists(st.integers(0, 24), min_size=k, max_size=k))
    arr = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    return lut.LutTable("rand", in_dtype, out_dtype, 1.0, 1.0, "segmented",
                        arr(e).reshape(k, n), arr(b), arr(m), arr(s),
                        draw(st.integers(0, 10)), mode)  # fmt: skip


def _probe(t: lut.LutTable, extra: list[int]) -> np.ndarray:
    """Boundary inputs (bounds +-1, range ends) plus ``extra`` random ones."""
    qmin, qmax = fp.qrange(t.in_dtype)
    b = t.bounds.tolist()
    pts = [qmin, qmin + 1, qmax - 1, qmax, 0] + [v + d for v in b for d in (-1, 0, 1)] + extra
    return np.array([min(max(p, qmin), qmax) for p in pts], dtype=np.int64)


@FAST
@given(t=random_tables(), extra=st.lists(st.integers(-40000, 40000), max_size=40))
def test_segmented_lookup_matches_reference(t, extra):
    q = _probe(t, extra)
    got = lut.lookup(t, q)
    assert got.dtype == np.int64
    assert got.tolist() == [ref_lookup(t, v) for v in q.tolist()]
    assert lut.lookup(t, torch.from_numpy(q)).tolist() == got.tolist()


@FAST
@given(
    name=st.sampled_from(["sigmoid", "tanh", "gelu", "exp"]),
    in_dtype=DTYPES,
    out_dtype=DTYPES,
    mode=MODES,
    dividing=st.sampled_from(["even", "curvature"]),
    shape=st.tuples(st.integers(1, 8), st.integers(2, 64), st.integers(0, 10)),
    lo=st.floats(-8, 0),
    width=st.floats(2, 8),
    extra=st.lists(st.integers(-40000, 40000), max_size=20),
)
def test_built_tables_match_reference(
    name, in_dtype, out_dtype, mode, dividing, shape, lo, width, extra
):
    seg, n, f_bits = shape
    s_in = fp.symmetric_scale(8.0, in_dtype)
    t = lut.build_segmented_table(name, FNS[name], s_in, fp.symmetric_scale(4.0, out_dtype),
                                  out_dtype, mode, in_dtype=in_dtype, segments=seg, entries=n,
                                  dividing=dividing, domain=(lo, lo + width), frac_bits=f_bits)  # fmt: skip
    assert np.all(np.diff(t.bounds) > 0)
    assert np.all(t.mults < 2**16)
    q = _probe(t, extra)
    assert lut.lookup(t, q).tolist() == [ref_lookup(t, v) for v in q.tolist()]


@FAST
@given(mode=MODES, out_dtype=DTYPES, amax=st.floats(0.1, 20), omax=st.floats(0.1, 2))
def test_direct_table_matches_reference_and_torch_fake_quant(mode, out_dtype, amax, omax):
    s_in, s_out = fp.symmetric_scale(amax, "int8"), fp.symmetric_scale(omax, out_dtype)
    q = torch.arange(-128, 128)
    y = torch.sigmoid(q.float() * torch.tensor(s_in, dtype=torch.float32))
    t = lut.build_direct_table("sigmoid", y.numpy(), s_in, s_out, out_dtype, mode)
    got = lut.lookup(t, q.numpy())
    assert got.tolist() == fp.quantize(y, s_out, out_dtype, mode).tolist()
    fq = fp.fake_quantize(y, s_out, out_dtype, mode).numpy()
    np.testing.assert_array_equal((got.astype(np.float32) * np.float32(s_out)), fq)
    assert lut.lookup(t, q).dtype == torch.int64
    assert lut.lookup(t, q).tolist() == got.tolist() == [ref_lookup(t, v) for v in range(-128, 128)]
    assert lut.lookup(t, np.array([-500, 500])).tolist() == [got[0], got[-1]]  # saturated input


ACCURACY = [  # (op, in amax, out amax, domain, dividing, max steps): int16 -> int16, 6 x 64
    ("sigmoid", 8, 1, None, "even", 2.0),
    ("tanh", 4, 1, None, "even", 3.0),
    ("gelu", 8, 8, None, "even", 2.0),
    ("silu", 8, 8, None, "even", 2.0),
    ("exp", 12, None, (-12, 0), "curvature", 2.0),
    ("reciprocal", 16, 1, (1, 16), "curvature", 1.5),
    ("rsqrt", 16, 2, (0.25, 16), "curvature", 1.5),
]


def _table(op, amax, omax, domain, dividing, entries=64):
    s_out = 2.0**-15 if omax is None else fp.symmetric_scale(omax, "int16")
    return lut.build_segmented_table(op, FNS[op], fp.symmetric_scale(amax, "int16"), s_out,
                                     "int16", "half_even", dividing=dividing, entries=entries,
                                     domain=domain)  # fmt: skip


@pytest.mark.parametrize("op,amax,omax,domain,dividing,steps", ACCURACY)
def test_segmented_accuracy(op, amax, omax, domain, dividing, steps):
    t = _table(op, amax, omax, domain, dividing)
    err = lut.max_error(t, FNS[op], domain=domain)
    assert err["size"] == 384 and err["kind"] == "segmented"
    assert err["max_err_steps"] <= steps, err
    coarse = lut.max_error(_table(op, amax, omax, domain, dividing, 16), FNS[op], domain=domain)
    assert coarse["max_err_steps"] > err["max_err_steps"]  # more entries, smaller error


@pytest.mark.parametrize("op", ["exp", "reciprocal", "rsqrt"])
def test_curvature_dividing_beats_even_on_curved_functions(op):
    _, amax, omax, domain, _, _ = next(a for a in ACCURACY if a[0] == op)
    errs = {
        div: lut.max_error(_table(op, amax, omax, domain, div), FNS[op], domain)["max_err_steps"]
        for div in ("even", "curvature")
    }
    assert errs["curvature"] <= errs["even"], errs


def test_whole_int16_range_numpy_and_torch_identical():
    t = _table("tanh", 8, 1, (-1, 1), "curvature")
    q = np.arange(-32768, 32768)
    got = lut.lookup(t, q)
    assert np.array_equal(lut.lookup(t, torch.from_numpy(q)).numpy(), got)
    assert got[0] == -32768 and got[-1] == 32767  # linear extrapolation, then saturation


def test_to_arrays_from_arrays_round_trip(tmp_path):
    for t in (_table("exp", 12, None, (-12, 0), "curvature"),
              lut.build_direct_table("tanh", np.tanh(np.arange(-128, 128) / 16), 1 / 16,
                                     1 / 127, "int8", "bpu_round")):  # fmt: skip
        np.savez(tmp_path / "t.npz", **lut.to_arrays(t))
        back = lut.from_arrays(dict(np.load(tmp_path / "t.npz")))
        assert lut.to_arrays(back).keys() == lut.to_arrays(t).keys()
        for key, v in lut.to_arrays(t).items():
            assert (
                np.array_equal(getattr(back, key), v)
                if isinstance(v, np.ndarray)
                else getattr(back, key) == v
            )
        q = np.arange(*fp.qrange(t.in_dtype))
        assert np.array_equal(lut.lookup(back, q), lut.lookup(t, q))


def test_bad_tables_raise():
    with pytest.raises(SimulatorError, match="256 values"):
        lut.build_direct_table("x", np.zeros(10), 1.0, 1.0, "int8", "half_even")
    with pytest.raises(SimulatorError, match="do not fit"):
        lut.build_segmented_table("x", np.exp, 1.0, 1.0, "int16", "half_even", domain=(0, 3))
    with pytest.raises(SimulatorError, match="dividing"):
        lut.build_segmented_table("x", np.exp, 1e-3, 1.0, "int16", "half_even", dividing="x")
    with pytest.raises(SimulatorError, match="rounding"):
        intmath.round_div(np.array([1]), 2, "up")


def test_a_direct_table_maps_inputs_outside_the_functions_domain_to_zero():
    """rsqrt(mean(x**2) + eps) builds its table over all 256 int8 inputs, negatives too:
    their NaN values become 0, not whatever casting NaN to an integer gives."""
    grid = np.arange(-128, 128, dtype=np.float32) / 16
    with np.errstate(invalid="ignore", divide="ignore"):
        values = 1 / np.sqrt(grid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = lut.build_direct_table("rsqrt", values, 1 / 16, 1 / 32, "int8", "half_even")
    assert np.all(t.entries[:128] == 0)
    assert t.entries[128] == 127 and t.entries[-1] == round(32 / np.sqrt(127 / 16))
