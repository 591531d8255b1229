"""Fixed-point primitives against a slow, obvious reference (exact rationals per element)."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith import intmath

FAST = settings(max_examples=150, deadline=None)
F32 = hnp.arrays(
    np.float32,
    st.integers(1, 64),
    elements=st.floats(-(2.0**100), 2.0**100, width=32, allow_nan=False, allow_infinity=False),
)
POT_EXP = st.integers(-20, 10)
MODES = st.sampled_from(fp.ROUNDING_MODES)
SMALL_DTYPES = st.sampled_from(["int8", "int16"])


def ref_round(v: Fraction, mode: str) -> int:
    """Round an exact rational: the tie rule written out by hand."""
    lo = math.floor(v)
    frac = v - lo
    if frac != Fraction(1, 2):
        return lo + (frac > Fraction(1, 2))
    if mode == "half_even":
        return lo if lo % 2 == 0 else lo + 1
    return lo + 1 if v > 0 else lo  # away from zero


def ref_quantize(x: np.ndarray, s: float, dtype: str, mode: str, exact_div: bool) -> list[int]:
    """clamp(round(x / s)) per element; the quotient exact or the float32 one."""
    qmin, qmax = fp.qrange(dtype)
    out = []
    for v in x.tolist():
        quot = Fraction(v) / Fraction(float(s)) if exact_div else Fraction(float(np.float32(v) / s))
        out.append(min(max(ref_round(quot, mode), qmin), qmax))
    return out


def ref_fake_quantize(x, s, dtype, mode, exact_div=True) -> np.ndarray:
    q = ref_quantize(x, s, dtype, mode, exact_div)
    return np.array([float(Fraction(v) * Fraction(float(s))) for v in q], dtype=np.float32)


@FAST
@given(x=F32, k=POT_EXP, dtype=SMALL_DTYPES, mode=MODES)
def test_fake_quantize_matches_reference_pot_scale(x, k, dtype, mode):
    s = np.float32(2.0**k)
    got = fp.fake_quantize(x, s, dtype, mode)
    np.testing.assert_array_equal(got, ref_fake_quantize(x, s, dtype, mode))
    assert got.dtype == np.float32


@FAST
@given(
    x=F32,
    s=st.floats(2.0**-20, 1024.0, width=32),
    dtype=SMALL_DTYPES,
    mode=MODES,
)
def test_fake_quantize_matches_reference_any_scale(x, s, dtype, mode):
    s = np.float32(s)
    got = fp.fake_quantize(x, s, dtype, mode)
    want = ref_fake_quantize(x, s, dtype, mode, exact_div=False)
    np.testing.assert_array_equal(got, want)


@FAST
@given(
    ks=hnp.arrays(np.int64, st.integers(1, 64), elements=st.integers(-40000, 40000)),
    e=POT_EXP,
    dtype=SMALL_DTYPES,
    mode=MODES,
)
def test_exact_ties(ks, e, dtype, mode):
    s = 2.0**e
    x = ((ks + 0.5) * s).astype(np.float32)  # every element is an exact .5 tie
    got = fp.quantize(x, s, dtype, mode)
    assert got.tolist() == ref_quantize(x, s, dtype, mode, exact_div=True)


@FAST
@given(x=F32, k=POT_EXP, dtype=st.sampled_from(["int8", "int16", "int32"]), mode=MODES)
def test_quantize_matches_reference_including_int32(x, k, dtype, mode):
    s = 2.0**k
    x64 = x.astype(np.float64)
    got = fp.quantize(x64, s, dtype, mode)
    assert got.dtype == np.int64
    assert got.tolist() == ref_quantize(x64, s, dtype, mode, exact_div=True)


@FAST
@given(x=F32, s=st.floats(2.0**-20, 1024.0, width=32), dtype=SMALL_DTYPES, mode=MODES)
def test_numpy_and_torch_agree_bit_for_bit(x, s, dtype, mode):
    s = np.float32(s)
    got_np = fp.fake_quantize(x, s, dtype, mode)
    got_t = fp.fake_quantize(torch.from_numpy(x), torch.tensor(s), dtype, mode)
    np.testing.assert_array_equal(got_np, got_t.numpy())
    q_np = fp.quantize(x, s, dtype, mode)
    q_t = fp.quantize(torch.from_numpy(x), float(s), dtype, mode)
    assert q_t.dtype == torch.int32
    np.testing.assert_array_equal(q_np, q_t.numpy())


def test_tie_rules_spelled_out():
    x = np.array([2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 3.5], dtype=np.float32)
    assert fp.round_half_even(x).tolist() == [2, -2, 0, 0, 2, -2, 4]
    assert fp.round_half_away(x).tolist() == [3, -3, 1, -1, 2, -2, 4]
    assert fp.round_by(torch.from_numpy(x), "half_even").tolist() == [2, -2, 0, 0, 2, -2, 4]
    assert fp.round_by(torch.from_numpy(x), "bpu_round").tolist() == [3, -3, 1, -1, 2, -2, 4]


def test_half_away_is_exact_where_naive_formula_is_not():
    below_half = np.nextafter(np.float32(0.5), np.float32(0))
    big_odd = np.float32(2**23 + 1)
    x = np.array([below_half, -below_half, big_odd, -big_odd], dtype=np.float32)
    assert fp.round_half_away(x).tolist() == [0, 0, 2**23 + 1, -(2**23) - 1]


@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_saturation(dtype):
    qmin, qmax = fp.qrange(dtype)
    x = np.array([1e9, -1e9, (qmax + 0.5), (qmin - 0.5)], dtype=np.float32)
    assert fp.quantize(x, 1.0, dtype, "bpu_round").tolist() == [qmax, qmin, qmax, qmin]
    assert fp.fake_quantize(x, 0.5, dtype, "half_even").tolist() == [
        qmax * 0.5,
        qmin * 0.5,
        qmax * 0.5,
        qmin * 0.5,
    ]


def test_per_channel_matches_per_channel_loop():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3, 2, 2)).astype(np.float32)
    s = np.array([0.01, 0.02, 0.1, 1.0], dtype=np.float32)
    got = fp.fake_quantize(w, s, "int8", "half_even", ch_axis=0)
    for c in range(4):
        np.testing.assert_array_equal(got[c], fp.fake_quantize(w[c], s[c], "int8", "half_even"))
    got_t = fp.fake_quantize(torch.from_numpy(w), torch.from_numpy(s), "int8", "half_even", 0)
    np.testing.assert_array_equal(got, got_t.numpy())
    last = fp.quantize(w, s[:2], "int8", "half_even", ch_axis=-1)
    np.testing.assert_array_equal(last[..., 1], fp.quantize(w[..., 1], s[1], "int8", "half_even"))


def test_scale_shape_mismatch_raises():
    with pytest.raises(SimulatorError, match="per-tensor"):
        fp.fake_quantize(np.ones((2, 3)), np.ones(2), "int8", "half_even")
    with pytest.raises(SimulatorError, match="channels"):
        fp.fake_quantize(np.ones((2, 3)), np.ones(3), "int8", "half_even", ch_axis=0)


def test_qrange_table():
    assert fp.qrange("int8") == (-128, 127)
    assert fp.qrange("int16") == (-32768, 32767)
    assert fp.qrange("int32") == (-(2**31), 2**31 - 1)
    with pytest.raises(SimulatorError, match="int4"):
        fp.qrange("int4")
    with pytest.raises(SimulatorError, match="rounding"):
        fp.round_by(np.ones(1), "half_up")


@FAST
@given(k=POT_EXP, dtype=SMALL_DTYPES)
def test_symmetric_scale_vendor_formula(k, dtype):
    qmin, qmax = fp.qrange(dtype)
    s = 2.0**k
    assert fp.symmetric_scale((qmax - qmin) / 2 * s, dtype) == s  # 127.5 * s -> s for int8


def test_symmetric_scale_per_channel_zero_and_errors():
    amax = np.array([0.0, 1.0, 255.0])
    np.testing.assert_array_equal(fp.symmetric_scale(amax, "int8"), [fp.MIN_SCALE, 2 / 255, 2.0])
    t = fp.symmetric_scale(torch.tensor([0.0, 1.0]), "int16")
    assert t.dtype == torch.float32
    assert t.tolist() == [pytest.approx(fp.MIN_SCALE), pytest.approx(2 / 65535)]
    for bad in (float("nan"), float("inf"), np.array([1.0, np.nan]), torch.tensor([-1.0])):
        with pytest.raises(SimulatorError, match="amax"):
            fp.symmetric_scale(bad, "int8")
    with pytest.raises(SimulatorError, match=r"max \|x\| = 3e\+38 gives an infinite int8"):
        fp.symmetric_scale(torch.tensor([1.0, 3.0e38]), "int8")  # 2 * amax overflows float32


@FAST
@given(s=st.floats(2.0**-100, 2.0**100) | st.floats(2.0**-100, 2.0**100, width=32))
def test_pot_scale_is_smallest_power_of_two_above(s):
    for arr in (np.array([s]), np.array([s], dtype=np.float32), torch.tensor([s])):
        p = fp.pot_scale(arr)
        p_val, s_val = float(p[0]), float(arr[0])
        assert s_val <= p_val < 2 * s_val
        assert math.frexp(p_val)[0] == 0.5  # an exact power of two


def test_pot_scale_keeps_powers_of_two_and_rejects_bad():
    assert fp.pot_scale(0.25) == 0.25
    assert fp.pot_scale(0.3) == 0.5
    assert fp.pot_scale(fp.MIN_SCALE) == fp.MIN_SCALE
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(SimulatorError):
            fp.pot_scale(bad)


@FAST
@given(
    v=st.lists(st.integers(-(2**50), 2**50), min_size=1, max_size=30),
    d=st.integers(1, 2**40) | st.sampled_from([1, 2, 4, 256, 3, 10]),
    mode=MODES,
)
def test_round_div_is_exact_round_by(v, d, mode):
    want = [ref_round(Fraction(x, d), mode) for x in v]
    assert intmath.round_div(np.array(v, dtype=np.int64), d, mode).tolist() == want
    assert intmath.round_div(torch.tensor(v, dtype=torch.int64), d, mode).tolist() == want
    ties = np.array([2 * x + 1 for x in v], dtype=np.int64) // 2 * 2 + 1  # odd: ties at d=2
    assert intmath.round_div(ties, 2, mode).tolist() == fp.round_by(ties / 2, mode).tolist()


def test_const_like_copies_a_read_only_table_into_torch_without_warning():
    table = np.arange(5, dtype=np.int64)
    table.setflags(write=False)
    ref = torch.zeros(2, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = intmath.const_like(table, ref)
    got += 1  # the copy is the tensor's own: the frozen table is untouched
    assert got.tolist() == [1, 2, 3, 4, 5] and table.tolist() == [0, 1, 2, 3, 4]
    writable = np.arange(3, dtype=np.int64)
    assert intmath.const_like(writable, ref).data_ptr() == writable.ctypes.data  # shared


def test_fixed_multiplier_vendor_example_and_largest_shift():
    assert [int(v) for v in intmath.fixed_multiplier(0.1 * 1.0 / 0.2028451, 15)] == [32308, 16]
    ratios = np.array([0.49299, 1e-6, 0.75, 63 * 256 / 7, 1.0])
    m, s = intmath.fixed_multiplier(ratios, 16)
    assert np.all(m < 2**16) and np.all(np.round(ratios * 2.0 ** (s + 1)) >= 2**16)
    with pytest.raises(SimulatorError, match=r"ratio 131072 is beyond .* ratios below 65535"):
        intmath.fixed_multiplier(2.0**17, 16)
    for bad in (0.0, -1.0, np.nan):
        with pytest.raises(SimulatorError, match="zero, negative or not finite"):
            intmath.fixed_multiplier(bad, 16)


def ref_requantize(acc: int, m: int, s: int, dtype: str, mode: str) -> int:
    qmin, qmax = fp.qrange(dtype)
    return min(max(ref_round(Fraction(acc * m, 2**s), mode), qmin), qmax)


@FAST
@given(
    acc=st.lists(st.integers(-(2**31) + 1, 2**31 - 1), min_size=1, max_size=20),
    m=st.integers(0, 2**31 - 1),
    s=st.integers(0, 62),
    dtype=st.sampled_from(["int8", "int16", "int32"]),
    mode=MODES,
)
def test_requantize_matches_reference(acc, m, s, dtype, mode):
    got = intmath.requantize(np.array(acc, dtype=np.int64), m, s, dtype, mode)
    assert got.dtype == np.int64
    assert got.tolist() == [ref_requantize(a, m, s, dtype, mode) for a in acc]
    got_t = intmath.requantize(torch.tensor(acc, dtype=torch.int32), m, s, dtype, mode)
    assert got_t.tolist() == got.tolist()


@pytest.mark.parametrize("mode", fp.ROUNDING_MODES)
def test_requantize_exact_ties_and_saturation(mode):
    acc = np.array([1, 3, 5, -1, -3, -5, 6, -6], dtype=np.int32)  # *3/2 or /2: all .5 ties
    want = [ref_requantize(int(a), 1, 1, "int8", mode) for a in acc]
    assert intmath.requantize(acc, 1, 1, "int8", mode).tolist() == want
    assert want[:3] == ([0, 2, 2] if mode == "half_even" else [1, 2, 3])
    big = np.array([2**31 - 1, -(2**31), 40000, -40000])
    assert (
        intmath.requantize(big, 2**31 - 1, 0, "int32", mode).tolist() == [2**31 - 1, -(2**31)] * 2
    )
    assert intmath.requantize(big, 1, 0, "int16", mode).tolist() == [32767, -32768] * 2


def test_requantize_public_example():
    m, s = intmath.fixed_multiplier(0.1 * 1.0 / 0.2028451, 15)
    assert (int(m), int(s)) == (32308, 16)
    assert int(intmath.requantize(np.array(1000), m, s, "int16", "bpu_round")) == round(
        1000 * 32308 / 65536
    )


def test_requantize_per_channel_axis():
    acc = np.arange(-12, 12, dtype=np.int64).reshape(2, 3, 4) * 1000
    m, s = np.array([3, 5, 7]), np.array([4, 6, 8])
    got = intmath.requantize(acc, m, s, "int16", "half_even", axis=1)
    for c in range(3):
        want = intmath.requantize(acc[:, c], m[c], s[c], "int16", "half_even")
        np.testing.assert_array_equal(got[:, c], want)
    one = intmath.requantize(acc, np.array([3]), np.array([4]), "int8", "half_even", axis=1)
    np.testing.assert_array_equal(one, intmath.requantize(acc, 3, 4, "int8", "half_even"))
    with pytest.raises(SimulatorError, match="channels"):
        intmath.requantize(acc, m, s, "int8", "half_even", axis=2)


def test_requantize_refuses_overflow_and_bad_input():
    with pytest.raises(SimulatorError, match="2\\*\\*62"):
        intmath.requantize(np.array([2**40]), 2**22, 0, "int32", "half_even")
    with pytest.raises(SimulatorError, match="shift"):
        intmath.requantize(np.array([1]), 1, 63, "int8", "half_even")
    with pytest.raises(SimulatorError, match="integer"):
        intmath.requantize(np.array([1.5]), 1, 0, "int8", "half_even")
    with pytest.raises(SimulatorError, match="rounding"):
        intmath.requantize(np.array([1]), 1, 0, "int8", "half_up")


@FAST
@given(
    ratios=st.lists(
        st.floats(1e-6, 200.0) | st.lists(st.floats(1e-6, 200.0), min_size=1, max_size=4),
        min_size=1,
        max_size=3,
    ),
    bits=st.sampled_from([8, 15, 16, 31]),
    mode=MODES,
)
def test_aligned_multipliers_keep_every_ratio_to_full_width(ratios, bits, mode):
    mults, s = intmath.aligned_multipliers(ratios, bits, mode)
    for r, m in zip(ratios, mults, strict=True):
        assert np.shape(m) == np.shape(r)
        for v, mv in zip(np.ravel(r).tolist(), np.ravel(m).tolist(), strict=True):
            mant, sh = intmath.fixed_multiplier(v, bits, mode)
            assert mv == int(mant) << (s - int(sh))  # the mantissa, shifted onto s
            assert abs(Fraction(mv, 2**s) - Fraction(v)) <= Fraction(v) / 2 ** (bits - 1)
    flat = np.concatenate([np.ravel(r) for r in ratios])
    assert s == max(int(intmath.fixed_multiplier(v, bits, mode)[1]) for v in flat.tolist())


def test_aligned_multipliers_errors_and_example():
    mults, s = intmath.aligned_multipliers([1.0, 1.4e-3], 15)  # a skip input and an accumulator
    assert s == 24 and int(mults[0]) == 2**24 and int(mults[1]) == round(1.4e-3 * 2**24)
    for bad in ([0.5, 0.0], [np.nan], [np.array([1.0, -1.0])], [np.inf], []):
        with pytest.raises(SimulatorError, match="finite and positive"):
            intmath.aligned_multipliers(bad, 16)
    with pytest.raises(SimulatorError):
        intmath.aligned_multipliers([2.0**16], 16)


@FAST
@given(
    v=st.lists(st.integers(-(2**61), 2**61), min_size=1, max_size=20),
    shifts=st.lists(st.integers(0, 62), min_size=1, max_size=1) | st.just([0, 1, 7, 31, 62]),
    mode=MODES,
)
def test_round_div_by_per_channel_powers_of_two(v, shifts, mode):
    """The shift path (every divisor a power of two, as requantize's ``2**shift``) on
    per-channel divisors equals exact rational rounding, numpy and torch alike."""
    d = np.array([2**s for s in shifts], dtype=np.int64)
    grid = np.array(v, dtype=np.int64)[:, None]
    want = [[ref_round(Fraction(x, int(dd)), mode) for dd in d] for x in v]
    assert intmath.round_div(grid, d, mode).tolist() == want
    assert intmath.round_div(torch.from_numpy(grid), torch.from_numpy(d), mode).tolist() == want
