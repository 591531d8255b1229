"""Integer kernels against slow nested-loop references in Python ints."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schemas.errors import SimulatorError
from simulator.arith.kernels import conv_int, gemm_dtype, matmul_int, max_pool_int, sum_pool_int

FAST = settings(max_examples=60, deadline=None)
DTYPES = st.sampled_from([np.int8, np.int16])


def rand_ints(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=np.int64).astype(dtype)


def _out_size(size, k, stride, pad_total, dilation) -> int:
    return (size + pad_total - dilation * (k - 1) - 1) // stride + 1


def _padded_value(x, n, c, pos, pads, fill):
    """x[n, c, pos - pad_begin] or ``fill`` outside x (the padding)."""
    idx = [p - pads[i] for i, p in enumerate(pos)]
    if all(0 <= v < x.shape[2 + i] for i, v in enumerate(idx)):
        return int(x[(n, c, *idx)]), True
    return fill, False


def ref_conv(x, w, strides, pads, dilations, group) -> np.ndarray:
    """y[n, o, p] = sum over in-channels of o's group and kernel taps, Python ints."""
    nd = x.ndim - 2
    n_, (o_, cg), kernel = x.shape[0], w.shape[:2], w.shape[2:]
    outs = [
        _out_size(x.shape[2 + i], kernel[i], strides[i], pads[i] + pads[nd + i], dilations[i])
        for i in range(nd)
    ]
    y = np.zeros((n_, o_, *outs), dtype=object)
    for n, o, *p in itertools.product(range(n_), range(o_), *map(range, outs)):
        g, acc = o // (o_ // group), 0
        for ci, *k in itertools.product(range(cg), *map(range, kernel)):
            pos = [p[i] * strides[i] + k[i] * dilations[i] for i in range(nd)]
            v, _ = _padded_value(x, n, g * cg + ci, pos, pads, 0)
            acc += v * int(w[(o, ci, *k)])
        y[(n, o, *p)] = acc
    return y


def ref_pool(x, kernel, strides, pads, dilations, fill, reduce):
    """reduce(list of window values, list of inside flags) per output position."""
    nd = len(kernel)
    outs = [
        _out_size(x.shape[2 + i], kernel[i], strides[i], pads[i] + pads[nd + i], dilations[i])
        for i in range(nd)
    ]
    y = np.zeros((*x.shape[:2], *outs), dtype=object)
    for n, c, *p in itertools.product(*map(range, x.shape[:2]), *map(range, outs)):
        taps = []
        for k in itertools.product(*map(range, kernel)):
            pos = [p[i] * strides[i] + k[i] * dilations[i] for i in range(nd)]
            taps.append(_padded_value(x, n, c, pos, pads, fill))
        y[(n, c, *p)] = reduce([v for v, _ in taps], [inside for _, inside in taps])
    return y


@st.composite
def conv_cases(draw):
    nd = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 3]))
    cg, og, n = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilations = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    spatial = [draw(st.integers(1, 7)) for _ in range(nd)]
    for i in range(nd):
        assume(_out_size(spatial[i], kernel[i], 1, pads[i] + pads[nd + i], dilations[i]) >= 1)
    return (n, group * cg, spatial), (group * og, cg, kernel), strides, pads, dilations, group


@FAST
@given(case=conv_cases(), xdt=DTYPES, wdt=DTYPES, seed=st.integers(0, 2**32 - 1))
def test_conv_matches_reference(case, xdt, wdt, seed):
    (n, c, spatial), (o, cg, kernel), strides, pads, dilations, group = case
    rng = np.random.default_rng(seed)
    x, w = rand_ints(rng, (n, c, *spatial), xdt), rand_ints(rng, (o, cg, *kernel), wdt)
    got = conv_int(x, w, strides, pads, dilations, group)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref_conv(x, w, strides, pads, dilations, group))


@pytest.mark.parametrize("nd", [1, 2])
def test_depthwise_conv_and_defaults(nd):
    rng = np.random.default_rng(nd)
    x = rand_ints(rng, (2, 4, *[6] * nd), np.int8)
    w = rand_ints(rng, (4, 1, *[3] * nd), np.int8)
    got = conv_int(x, w, [2] * nd, [1] * 2 * nd, [1] * nd, group=4)
    np.testing.assert_array_equal(got, ref_conv(x, w, [2] * nd, [1] * 2 * nd, [1] * nd, 4))
    plain = conv_int(x, rand_ints(rng, (3, 4, *[1] * nd), np.int8))  # defaults: 1s, 0s
    assert plain.shape == (2, 3, *[6] * nd)


def test_conv_extreme_values_are_exact():
    x = np.full((1, 64, 5, 5), -32768, np.int16)
    w = np.full((2, 64, 3, 3), -128, np.int8)
    got = conv_int(x, w, pads=[1, 1, 1, 1])
    assert got[0, 0, 2, 2] == 64 * 9 * 32768 * 128  # 2**34.2, exact
    assert got[0, 0, 0, 0] == 64 * 4 * 32768 * 128


@pytest.mark.parametrize("kernel", [1, 3])  # the 1x1 (taps) and the im2col path
def test_conv_past_the_float32_bound_is_exact(kernel):
    c = 1101 if kernel == 1 else 123  # 1101 or 1107 terms of 127 * 127: an odd sum past 2**24
    x = np.full((1, c, kernel, kernel), 127, np.int8)
    w = np.full((1, c, kernel, kernel), 127, np.int8)
    assert gemm_dtype(127, w) == np.float64
    assert conv_int(x, w)[0, 0, 0, 0] == c * kernel**2 * 127 * 127  # float32 would round


def test_conv_within_the_float32_bound_runs_in_float32_and_is_exact():
    rng = np.random.default_rng(0)
    x = rand_ints(rng, (2, 64, 9, 9), np.int8)
    w = rng.integers(-8, 8, (16, 64, 3, 3)).astype(np.int8)  # sum |w| <= 4608: 2**19.2 bound
    assert gemm_dtype(128, w) == np.float32
    np.testing.assert_array_equal(
        conv_int(x, w, pads=[1] * 4), ref_conv(x, w, [1, 1], [1] * 4, [1, 1], 1)
    )


def test_kernels_refuse_bad_input():
    x, w = np.ones((1, 4, 5, 5), np.int8), np.ones((2, 2, 3, 3), np.int8)
    with pytest.raises(SimulatorError, match="2\\*\\*53"):
        conv_int(np.full((1, 2, 3, 3), 2**46), w * 64, group=1)
    with pytest.raises(SimulatorError, match="group"):
        conv_int(x, w, group=1)
    with pytest.raises(SimulatorError, match="geometry"):
        conv_int(x, w, strides=[0, 1], group=2)
    with pytest.raises(SimulatorError, match="larger than"):
        conv_int(x, np.ones((2, 2, 7, 7), np.int8), group=2)
    with pytest.raises(SimulatorError, match="integer"):
        matmul_int(np.ones((2, 2)), np.ones((2, 2), np.int8))
    with pytest.raises(SimulatorError, match="shapes"):
        matmul_int(np.ones((2, 3), np.int8), np.ones((2, 3), np.int8))


@FAST
@given(
    batch=st.sampled_from([(), (2,), (2, 1), (1, 3)]),
    m=st.integers(1, 4),
    k=st.integers(1, 5),
    n=st.integers(1, 4),
    adt=DTYPES,
    seed=st.integers(0, 2**32 - 1),
)
def test_matmul_matches_reference(batch, m, k, n, adt, seed):
    rng = np.random.default_rng(seed)
    a, b = rand_ints(rng, (*batch, m, k), adt), rand_ints(rng, (k, n), np.int8)
    got = matmul_int(a, b)
    want = np.matmul(a.astype(object), b.astype(object))  # Python-int dot products
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(matmul_int(a, b[:, 0]), want[..., 0])  # 1-D right operand


@st.composite
def pool_cases(draw):
    nd = draw(st.sampled_from([1, 2]))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilations = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    spatial = [draw(st.integers(1, 6)) for _ in range(nd)]
    for i in range(nd):
        assume(_out_size(spatial[i], kernel[i], 1, pads[i] + pads[nd + i], dilations[i]) >= 1)
    return spatial, kernel, strides, pads, dilations


@FAST
@given(case=pool_cases(), dt=DTYPES, seed=st.integers(0, 2**32 - 1))
def test_pools_match_reference(case, dt, seed):
    spatial, kernel, strides, pads, dilations = case
    x = rand_ints(np.random.default_rng(seed), (2, 3, *spatial), dt)
    sums, counts = sum_pool_int(x, kernel, strides, pads)
    ones = [1] * len(kernel)
    np.testing.assert_array_equal(
        sums, ref_pool(x, kernel, strides, pads, ones, 0, lambda v, i: sum(v))
    )
    np.testing.assert_array_equal(
        counts, ref_pool(x, kernel, strides, pads, ones, 0, lambda v, i: sum(i))
    )
    assert sums.dtype == counts.dtype == np.int64
    got = max_pool_int(x, kernel, strides, pads, dilations)
    qmin = int(np.iinfo(dt).min)
    assert got.dtype == dt
    np.testing.assert_array_equal(got, ref_pool(x, kernel, strides, pads, dilations, qmin, lambda v, i: max(v)))  # fmt: skip


def test_max_pool_pad_never_wins_and_counts_exclude_pad():
    x = np.full((1, 1, 2, 2), -128, np.int8)
    assert max_pool_int(x, [2, 2], [1, 1], [1, 1, 1, 1]).tolist() == [[[[-128] * 3] * 3]]
    _, counts = sum_pool_int(x, [2, 2], [1, 1], [1, 1, 1, 1])
    assert counts[0, 0].tolist() == [[1, 2, 1], [2, 4, 2], [1, 2, 1]]
    assert math.prod(counts.shape) == 9
