"""Per-layer agreement metrics of two stages' tensors, per sample and streamed aggregates.

For a base tensor ``a`` and an analysis tensor ``b`` of one sample (flattened, NaN/Inf
counted and then read as 0), with ``d = b - a``, ``n`` elements and quantization step ``s``:

- cosine = <a, b> / (|a| |b|)  (1 when both are all zero, 0 when only one is)
- mse = sum(d^2) / n,  l1 = sum|d| / n,  max_abs = max|d|
- sqnr_db = 10 log10(sum(a^2) / sum(d^2))  (+inf when d = 0)
- max_qscale_diff = max_abs / s: how many quantization steps apart (about 0.5 is rounding)
- exact_ratio = share of elements with |d| <= s / 100 (same integer at the same scale)
- rtol = max|d| / max|a|  (relative tolerance: the largest difference against the base's
  largest magnitude; 0 when both are 0, +inf when only the base is all zero)
- base_var, analysis_var = sum(x^2) / n - mean(x)^2  (population variance of each side)
- kl = sum_i p_i log(p_i / max(q_i, 1e-10)) over bins with p_i > 0: the KL divergence of
  the analysis tensor's value histogram q from the base's p, both counted in the same
  ``BINS`` equal-width bins over [lo, hi] (:func:`hist_edges`: the two sides' min and max
  on the first batch; later values outside fall into the end bins), normalized to sum 1.
  Only computed when :func:`sums` is given the edges.

Aggregates over many samples use running sums of the same quantities (``Accumulator``), so
memory does not grow with the number of samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.runtime import native

METRICS = ("cosine", "mse", "l1", "max_abs", "sqnr_db", "max_qscale_diff", "exact_ratio",
           "rtol", "kl")  # fmt: skip
SIDES = ("min", "max", "mean")
BINS = 256
"""Histogram bins of the KL column (the number of int8 levels)."""
SUMS = ("ab", "aa", "bb", "d2", "d1", "exact", "a_sum", "b_sum", "a_nan", "b_nan", "n")


def _flat(x: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64 batch x n with non-finite read as 0, non-finite count per sample)."""
    x = np.asarray(x, dtype=np.float64).reshape(batch, -1)
    bad = ~np.isfinite(x)
    if not bad.any():  # the common case: no copy
        return x, np.zeros(batch, dtype=np.int64)
    return np.where(bad, 0.0, x), bad.sum(axis=1)


def sums(
    a: np.ndarray, b: np.ndarray, step: float, edges: tuple[float, float] | None = None
) -> dict[str, np.ndarray]:
    """Per-sample sums (batch-length arrays) from which every metric follows; with
    ``edges`` (:func:`hist_edges`) also both sides' histograms (batch x ``BINS``).

    One pass of the compiled kernel (simulator/csrc/qstats.c: the same float64 operations,
    sums in element order) when the simulator's kernels load, else :func:`numpy_sums`; the
    two agree to float64 rounding, their histograms exactly."""
    a, b = np.asarray(a), np.asarray(b)
    lib = native.untraced()
    if lib is None or a.size != b.size or not a.ndim:
        return numpy_sums(a, b, step, edges)
    return _native_sums(lib, a, b, step, edges)


def _native_sums(lib, a: np.ndarray, b: np.ndarray, step: float, edges) -> dict[str, np.ndarray]:
    """:func:`sums` through ``qp_pair_sums`` (float32 and float64 read as they are)."""
    batch = a.shape[0]
    fa, fb = _floats(a, batch), _floats(b, batch)
    out = np.empty((batch, len(_NATIVE)))
    bins = BINS if edges is not None else 0
    ha, hb = np.zeros((batch, max(bins, 1))), np.zeros((batch, max(bins, 1)))
    lo, hi = edges if edges is not None else (0.0, 1.0)
    lib.qp_pair_sums(fa.ctypes.data, int(fa.dtype == np.float64), fb.ctypes.data,
                     int(fb.dtype == np.float64), batch, fa.shape[1], step / 100, lo,
                     BINS / (hi - lo), bins, out.ctypes.data, ha.ctypes.data, hb.ctypes.data)  # fmt: skip
    got = {k: out[:, i] for i, k in enumerate(_NATIVE)}
    got["a_nan"], got["b_nan"] = got["a_nan"].astype(np.int64), got["b_nan"].astype(np.int64)
    got["n"] = np.full(batch, fa.shape[1], dtype=np.float64)
    return ({"ha": ha, "hb": hb} if bins else {}) | got


_NATIVE = ("ab", "aa", "bb", "d2", "d1", "dmax", "exact", "a_sum", "b_sum", "a_nan", "b_nan",
           "a_min", "a_max", "a_abs", "b_min", "b_max")  # fmt: skip
"""qp_pair_sums' row of sums, in its order (simulator/csrc/qstats.c)."""


def _floats(x: np.ndarray, batch: int) -> np.ndarray:
    """``x`` as a C-contiguous (batch, n) float32 or float64 array (other dtypes: float64)."""
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    return np.ascontiguousarray(x.reshape(batch, -1))


def numpy_sums(
    a: np.ndarray, b: np.ndarray, step: float, edges: tuple[float, float] | None = None
) -> dict[str, np.ndarray]:
    """:func:`sums` in numpy (the reference of the compiled kernel, and its fallback)."""
    batch = a.shape[0]
    (fa, na), (fb, nb) = _flat(a, batch), _flat(b, batch)
    d = fb - fa
    ad = np.abs(d)
    hist = {} if edges is None else {"ha": _hist(fa, edges), "hb": _hist(fb, edges)}
    return hist | {
        "ab": _dots(fa, fb), "aa": _dots(fa, fa), "bb": _dots(fb, fb),
        "d2": _dots(d, d), "d1": ad.sum(1), "dmax": ad.max(1, initial=0.0),
        "exact": (ad <= step / 100).sum(1).astype(np.float64),
        "a_sum": fa.sum(1), "b_sum": fb.sum(1), "a_nan": na, "b_nan": nb,
        "n": np.full(batch, fa.shape[1], dtype=np.float64),
        "a_min": fa.min(1, initial=np.inf), "a_max": fa.max(1, initial=-np.inf),
        "a_abs": np.abs(fa).max(1, initial=0.0),
        "b_min": fb.min(1, initial=np.inf), "b_max": fb.max(1, initial=-np.inf),
    }  # fmt: skip


def hist_edges(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The [lo, hi] of a layer's KL histograms: min and max of both sides' finite values;
    ``hi`` at least ``lo + 1`` and at least the next float above ``lo`` (where ``lo + 1``
    rounds back to ``lo``: a constant 1e30 layer), so ``BINS / (hi - lo)`` is defined."""
    both = np.concatenate([np.ravel(a), np.ravel(b)]).astype(np.float64)
    both = both[np.isfinite(both)]
    lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 0.0)
    return lo, hi if hi > lo else max(lo + 1.0, float(np.nextafter(lo, np.inf)))


def _hist(x: np.ndarray, edges: tuple[float, float]) -> np.ndarray:
    """Row-wise counts of ``x`` (batch x n) in ``BINS`` equal bins over ``edges`` (values
    outside go to the end bins), as one bincount."""
    lo, hi = edges
    idx = np.clip((x - lo) * (BINS / (hi - lo)), 0, BINS - 1).astype(np.int64)  # clip first
    idx += np.arange(x.shape[0])[:, None] * BINS
    return np.bincount(idx.ravel(), minlength=x.shape[0] * BINS).reshape(-1, BINS).astype(float)


def _kl(ha: np.ndarray, hb: np.ndarray) -> np.ndarray:
    """Row-wise KL(p || q) of two count histograms (module docstring)."""
    p = ha / np.maximum(ha.sum(1, keepdims=True), 1)
    q = hb / np.maximum(hb.sum(1, keepdims=True), 1)
    terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1) / np.maximum(q, 1e-10)), 0.0)
    return terms.sum(1)


def _dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products (one pass, no temporary product array)."""
    return np.einsum("ij,ij->i", a, b)


def finish(s: dict[str, np.ndarray], step: float) -> dict[str, np.ndarray]:
    """The metrics of :data:`METRICS` and the sides' min/max/mean from sums (vectorized)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.sqrt(s["aa"] * s["bb"])
        both_zero = (s["aa"] == 0) & (s["bb"] == 0)
        cosine = np.where(both_zero, 1.0, np.where(norm > 0, s["ab"] / norm, 0.0))
        sqnr = np.where(s["d2"] == 0, np.inf, 10 * np.log10(s["aa"] / s["d2"]))
        n = np.maximum(s["n"], 1)
        rtol = np.where(s["dmax"] == 0, 0.0, s["dmax"] / s["a_abs"])
        a_mean, b_mean = s["a_sum"] / n, s["b_sum"] / n
        kl = {"kl": _kl(s["ha"], s["hb"])} if "ha" in s else {}
        return kl | {
            "cosine": np.clip(cosine, -1.0, 1.0),
            "mse": s["d2"] / n,
            "l1": s["d1"] / n,
            "max_abs": s["dmax"],
            "sqnr_db": sqnr,
            "max_qscale_diff": s["dmax"] / step if step > 0 else np.full_like(n, np.nan),
            "exact_ratio": s["exact"] / n,
            "rtol": rtol,
            "base_min": s["a_min"], "base_max": s["a_max"], "base_mean": a_mean,
            "analysis_min": s["b_min"], "analysis_max": s["b_max"], "analysis_mean": b_mean,
            "base_var": np.maximum(s["aa"] / n - a_mean**2, 0.0),
            "analysis_var": np.maximum(s["bb"] / n - b_mean**2, 0.0),
        }  # fmt: skip


@dataclass
class Accumulator:
    """Running totals of one layer's :func:`sums` over every sample seen so far."""

    totals: dict[str, float] = field(default_factory=dict)

    def add(self, s: dict[str, np.ndarray]) -> None:
        for k, v in s.items():
            if k in ("ha", "hb"):  # histograms: summed bin by bin
                self.totals[k] = self.totals.get(k, 0.0) + np.asarray(v).sum(0)
            elif k in ("dmax", "a_max", "b_max", "a_abs"):
                self.totals[k] = max(self.totals.get(k, -np.inf), float(np.max(v)))
            elif k in ("a_min", "b_min"):
                self.totals[k] = min(self.totals.get(k, np.inf), float(np.min(v)))
            else:
                self.totals[k] = self.totals.get(k, 0.0) + float(np.sum(v))

    def result(self, step: float) -> dict[str, float]:
        """The aggregate metrics: the formulas of the module docstring over all samples."""
        arrays = {k: np.asarray([v]) for k, v in self.totals.items()}
        return {k: float(v[0]) for k, v in finish(arrays, step).items()}


def step_of(scale: float | None, base: np.ndarray) -> float:
    """A layer's quantization step: its scale, else the int8 step of the base's range."""
    if scale:
        return float(scale)
    finite = np.abs(np.asarray(base, dtype=np.float64))
    finite = finite[np.isfinite(finite)]
    return float(finite.max()) / 127 if finite.size and finite.max() > 0 else 1.0
