"""analysis.metrics against slow, obvious per-sample formulas (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from analysis.metrics import Accumulator, finish, hist_edges, numpy_sums, step_of, sums
from simulator.runtime import native

finite = st.floats(-100, 100, allow_nan=False, width=32)
pairs = st.integers(1, 4).flatmap(
    lambda b: st.tuples(
        arrays(np.float32, (b, 6), elements=finite), arrays(np.float32, (b, 6), elements=finite)
    )
)


def reference(a: list[float], b: list[float], step: float) -> dict:
    """The module docstring's formulas, one sample, plain Python."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    aa, bb = sum(x * x for x in a), sum(y * y for y in b)
    ab = sum(x * y for x, y in zip(a, b, strict=True))
    d2 = sum(v * v for v in d)
    cos = 1.0 if aa == 0 and bb == 0 else (ab / math.sqrt(aa * bb) if aa * bb > 0 else 0.0)
    return {
        "cosine": max(-1.0, min(1.0, cos)),
        "mse": d2 / len(a),
        "l1": sum(abs(v) for v in d) / len(a),
        "max_abs": max(abs(v) for v in d),
        "sqnr_db": math.inf if d2 == 0 else (10 * math.log10(aa / d2) if aa > 0 else -math.inf),
        "exact_ratio": sum(abs(v) <= step / 100 for v in d) / len(a),
    }


@pytest.mark.parametrize("how", [sums, numpy_sums], ids=["sums", "numpy_sums"])
@settings(max_examples=60, deadline=None)
@given(ab=pairs, step=st.sampled_from([0.01, 0.5, 1.0]))
def test_per_sample_metrics_match_the_formulas(how, ab, step):
    a, b = ab
    got = finish(how(a, b, step), step)
    for i in range(a.shape[0]):
        want = reference(a[i].astype(float).tolist(), b[i].astype(float).tolist(), step)
        for key, value in want.items():
            assert math.isclose(got[key][i], value, rel_tol=1e-9, abs_tol=1e-9), key
        assert math.isclose(got["max_qscale_diff"][i], want["max_abs"] / step, rel_tol=1e-9)


@settings(max_examples=40, deadline=None)
@given(pairs, pairs)
def test_streamed_aggregate_equals_one_pass(first, second):
    (a1, b1), (a2, b2) = first, second
    acc = Accumulator()
    acc.add(sums(a1, b1, 0.5))
    acc.add(sums(a2, b2, 0.5))
    whole = sums(
        np.concatenate([a1, a2]).reshape(1, -1), np.concatenate([b1, b2]).reshape(1, -1), 0.5
    )
    want = {k: float(v[0]) for k, v in finish(whole, 0.5).items()}
    got = acc.result(0.5)
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-9) or (
            math.isinf(value) and got[key] == value
        ), key


def test_non_finite_values_are_counted_and_read_as_zero():
    a = np.array([[1.0, np.nan, np.inf]], dtype=np.float32)
    s = sums(a, np.ones_like(a), 1.0)
    assert s["a_nan"][0] == 2 and s["b_nan"][0] == 0
    assert finish(s, 1.0)["max_abs"][0] == 1.0


def test_step_is_the_scale_else_the_int8_step_of_the_range():
    assert step_of(0.25, np.zeros(3)) == 0.25
    assert step_of(None, np.array([-2.54, 1.0])) == 2.54 / 127
    assert step_of(None, np.zeros(3)) == 1.0


def test_rtol_and_variances_match_the_formulas():
    a = np.array([[1.0, -4.0, 2.0, 1.0]])
    b = np.array([[1.5, -4.0, 2.0, 0.0]])
    got = finish(sums(a, b, 0.5), 0.5)
    assert math.isclose(got["rtol"][0], 1.0 / 4.0)  # max|b - a| / max|a|
    assert math.isclose(got["base_var"][0], float(np.var(a)))
    assert math.isclose(got["analysis_var"][0], float(np.var(b)))
    zero = finish(sums(np.zeros((1, 3)), np.zeros((1, 3)), 1.0), 1.0)
    assert zero["rtol"][0] == 0.0


def test_kl_is_zero_for_equal_histograms_and_grows_with_the_shift():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 4000))
    edges = hist_edges(a, a + 0.5)
    same = finish(sums(a, a.copy(), 0.1, edges), 0.1)["kl"]
    small = finish(sums(a, a + 0.1, 0.1, edges), 0.1)["kl"]
    large = finish(sums(a, a + 0.5, 0.1, edges), 0.1)["kl"]
    assert np.all(same == 0) and np.all(small > 0) and np.all(large > small)


def test_kl_of_streamed_histograms_equals_one_pass():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4, 500)), rng.normal(0.2, 1.1, size=(4, 500))
    edges = hist_edges(a[:2], b[:2])  # fixed on the "first batch": later values clip
    acc = Accumulator()
    acc.add(sums(a[:2], b[:2], 0.1, edges))
    acc.add(sums(a[2:], b[2:], 0.1, edges))
    whole = sums(a.reshape(1, -1), b.reshape(1, -1), 0.1, edges)
    assert math.isclose(acc.result(0.1)["kl"], finish(whole, 0.1)["kl"][0], rel_tol=1e-12)
    p, _ = np.histogram(np.clip(a, *edges), bins=256, range=edges)
    q, _ = np.histogram(np.clip(b, *edges), bins=256, range=edges)
    p, q = p / p.sum(), q / q.sum()
    want = float(np.sum(p[p > 0] * np.log(p[p > 0] / np.maximum(q[p > 0], 1e-10))))
    assert math.isclose(acc.result(0.1)["kl"], want, rel_tol=1e-9)


def test_values_outside_the_kl_edges_count_in_the_end_bins():
    a, b = np.array([[0.0, 1.0]]), np.array([[1e300, -1e300]])
    s = sums(a, b, 1.0, (0.0, 1.0))
    assert s["hb"][0, -1] == 1 and s["hb"][0, 0] == 1 and s["hb"].sum() == 2
    assert finish(s, 1.0)["kl"][0] == 0.0  # same two end bins, same histogram


special = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1e30, -1e-30])
dtypes = st.sampled_from([np.float32, np.float64, np.int8, np.int32])


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 40),
    dtypes,
    dtypes,
    st.integers(0, 2**32 - 1),
    st.lists(special, max_size=4),
    st.booleans(),
)
def test_the_compiled_sums_equal_numpys(batch, n, da, db, seed, extra, with_edges):
    """simulator/csrc/qstats.c against :func:`numpy_sums`: every sum to float64 rounding,
    the counts and histograms exactly, on float32/float64/integer sides and non-finite
    values."""
    if native.untraced() is None:
        pytest.skip(f"compiled kernels {native.status()}")
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((batch, n)) * 50).astype(np.float64)
    b = a + rng.standard_normal((batch, n)) * rng.choice([0.0, 0.1, 10.0])
    for i, v in enumerate(extra):  # non-finite and extreme values, where the dtype holds them
        (a if i % 2 else b).flat[rng.integers(a.size)] = v
    a, b = (x.astype(t) if t in (np.float32, np.float64) else np.nan_to_num(x).clip(-100, 100)
            .astype(t) for x, t in ((a, da), (b, db)))  # fmt: skip
    edges = hist_edges(a, b) if with_edges else None
    got, want = sums(a, b, 0.5, edges), numpy_sums(a, b, 0.5, edges)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert np.allclose(got[key], want[key], rtol=1e-12, atol=0, equal_nan=True), key
    for key in ("exact", "a_nan", "b_nan", "n", "ha", "hb"):
        assert (got.get(key) == want.get(key)).all() if key in want else key not in got


@pytest.mark.parametrize("how", [sums, numpy_sums], ids=["sums", "numpy_sums"])
def test_a_constant_huge_layer_has_kl_edges_and_zero_kl(how):
    """lo + 1 == lo at 1e30: the edges still differ, and KL of equal sides is 0."""
    a = np.full((1, 5), 1e30, dtype=np.float32)
    edges = hist_edges(a, a)
    assert edges[1] > edges[0]
    assert finish(how(a, a.copy(), 1.0, edges), 1.0)["kl"][0] == 0.0
