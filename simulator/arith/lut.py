"""Fixed-point lookup tables of the modelled Nash BPU (sigmoid, tanh, exp, rsqrt, ...).

pre_export builds the tables; the exported ONNX graph, convert and the simulator all
evaluate them through :func:`lookup`, so every stage sees the same integers.

- ``direct``: int8 input, one entry per input integer, ``out = entries[q - qmin]``.
- ``segmented``: K segments ``[bounds[k], bounds[k+1])`` of N entries each, sampled at N
  evenly spaced real positions from ``bounds[k]`` to ``bounds[k+1]`` (both included).
  Inside a segment the position is a fixed-point number with ``F = frac_bits`` fraction
  bits, obtained with the per-segment multiplier/shift (the vendor's per-segment
  scale/shift), then linear interpolation between two entries. Outside ``[bounds[0],
  bounds[K]]``: linear extrapolation from the two outermost entries, then saturation.

:func:`lookup` is integer only (int64 intermediates, no float), on numpy or torch.
Integer rounding of a division (:func:`round_div`) uses the same tie rules as
:func:`simulator.arith.fixedpoint.round_by` and is tested against it on exact rationals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import clamp, const_like, fixed_multiplier, round_div, where

MULT_BITS = 16
"""Segment position multipliers are ``< 2**MULT_BITS`` (largest shift that fits)."""


@dataclass(frozen=True, eq=False)
class LutTable:
    """One lookup table; see the module docstring for how each kind is evaluated."""

    op: str  # "sigmoid", "exp", ... (informational)
    in_dtype: str  # "int8" | "int16"
    out_dtype: str  # "int8" | "int16"
    in_scale: float
    out_scale: float
    kind: str  # "direct" | "segmented"
    entries: np.ndarray  # direct: int64 [256]; segmented: int64 [K, N]
    bounds: np.ndarray  # segmented: int64 [K+1], strictly increasing; direct: empty
    mults: np.ndarray  # segmented: int64 [K]; direct: empty
    shifts: np.ndarray  # segmented: int64 [K]; direct: empty
    frac_bits: int  # F of the in-segment position; 0 for direct
    rounding: str  # rounding of the interpolation shift ("half_even" | "bpu_round")


_EMPTY = np.zeros(0, dtype=np.int64)


def build_direct_table(op, values, in_scale, out_scale, out_dtype, rounding) -> LutTable:
    """256-entry int8 table from ``values = f((qmin..qmax) * in_scale)`` computed by the caller.

    FORMULA: ``entries = clamp(round_by(values / out_scale), out qrange)``, computed by
    :func:`simulator.arith.fixedpoint.quantize`, i.e. in the dtype of ``values`` (float32 values
    divide in float32), exactly like torch fake quant of the same float values. An input
    outside the function's domain (NaN: sqrt, rsqrt or log of a negative) gets entry 0.
    """
    values = values.detach().cpu().numpy() if fp._is_torch(values) else np.asarray(values)
    if values.shape != (256,):
        raise SimulatorError(
            f"direct table needs 256 values, got shape {values.shape}",
            where=f"lut {op}",
            hint="evaluate the function at the 256 int8 inputs (-128..127) * in_scale",
        )
    entries = fp.quantize(np.where(np.isnan(values), 0, values), out_scale, out_dtype, rounding)
    return LutTable(op, "int8", out_dtype, float(in_scale), float(out_scale), "direct",
                    entries, _EMPTY, _EMPTY, _EMPTY, 0, rounding)  # fmt: skip


def _domain_ints(in_dtype: str, in_scale: float, domain) -> tuple[int, int]:
    """Input integers ``[lo, hi]`` covered: ``ceil(lo_real/s), floor(hi_real/s)`` within qrange."""
    qmin, qmax = fp.qrange(in_dtype)
    if domain is None:
        return qmin, qmax
    lo = max(qmin, int(np.ceil(domain[0] / in_scale)))
    hi = min(qmax, int(np.floor(domain[1] / in_scale)))
    return lo, hi


def _curvature_bounds(fn, lo: int, hi: int, k: int, in_scale: float) -> np.ndarray:
    """Dividing points at equal quantiles of the cumulative ``sqrt(|f''|) + floor``.

    FORMULA: ``w(x) = |f''(x)|**0.5 + 0.05 * mean(|f''|**0.5)`` sampled at up to 4097
    points; ``b_k = C^-1(k/K * C(hi))`` with ``C`` the trapezoid integral of ``w``. The
    square root equalizes the interpolation error ``h**2 |f''| / 8`` across segments
    (plain ``|f''|`` starves the flat end: 14.5 steps on exp vs 5.9 even, 1.8 with sqrt).
    """
    x = np.linspace(lo, hi, min(hi - lo + 1, 4097)) * in_scale
    f = np.asarray(fn(x), dtype=np.float64)
    curv = np.sqrt(np.abs(np.gradient(np.gradient(f, x), x)))
    curv = np.nan_to_num(curv, nan=0.0, posinf=0.0) + 1e-12
    w = curv + 0.05 * curv.mean()
    cum = np.concatenate([[0.0], np.cumsum((w[1:] + w[:-1]) / 2 * np.diff(x))])
    pos = np.interp(cum[-1] * np.arange(k + 1) / k, cum, x) / in_scale
    return fp.round_by(pos, "half_even").astype(np.int64)


def _bounds(fn, lo: int, hi: int, k: int, dividing: str, in_scale: float) -> np.ndarray:
    """K+1 strictly increasing integers from lo to hi, "even" or by "curvature"."""
    if dividing == "even":
        b = fp.round_by(np.linspace(lo, hi, k + 1), "half_even").astype(np.int64)
    elif dividing == "curvature":
        b = _curvature_bounds(fn, lo, hi, k, in_scale)
    else:
        raise SimulatorError(f"unknown dividing {dividing!r}", hint="use even or curvature")
    idx = np.arange(k + 1)
    b = np.clip(b, lo + idx, hi - k + idx)  # room for one integer per segment
    b = np.maximum.accumulate(b - idx) + idx  # strictly increasing
    b[0], b[-1] = lo, hi
    return b


def build_segmented_table(op, fn: Callable, in_scale, out_scale, out_dtype, rounding, *,
                          in_dtype="int16", segments=6, entries=64, dividing="even",
                          domain=None, frac_bits=8) -> LutTable:  # fmt: skip
    """Segmented table of ``fn`` (float64 numpy in, float array out) over ``domain``.

    FORMULA: segment k samples ``x_j = (b_k + j (b_{k+1} - b_k) / (N-1)) * in_scale``,
    ``e[k, j] = clamp(round_by(fn(x_j) / out_scale))``; position multiplier
    ``mults[k] / 2**shifts[k] ~ (N-1) * 2**F / (b_{k+1} - b_k)`` (:func:`fixed_multiplier`,
    16 bits). ``domain`` (real) defaults to the whole input range, intersected with it.
    """
    lo, hi = _domain_ints(in_dtype, in_scale, domain)
    if entries < 2 or segments < 1 or hi - lo < segments:
        raise SimulatorError(
            f"{segments} segments x {entries} entries do not fit input integers [{lo}, {hi}]",
            where=f"lut {op}",
            hint="widen the domain, use fewer segments, or at least 2 entries",
        )
    b = _bounds(fn, lo, hi, segments, dividing, in_scale)
    t = np.linspace(0.0, 1.0, entries)
    x = (b[:-1, None] + t[None, :] * np.diff(b)[:, None]) * float(in_scale)
    e = fp.quantize(np.asarray(fn(x), dtype=np.float64), out_scale, out_dtype, rounding)
    m, s = fixed_multiplier((entries - 1) * 2.0**frac_bits / np.diff(b), MULT_BITS)
    return LutTable(op, in_dtype, out_dtype, float(in_scale), float(out_scale), "segmented",
                    e, b, m, s, int(frac_bits), rounding)  # fmt: skip


def _segmented(t: LutTable, q):
    """Interpolate inside ``[b_0, b_K]``, extrapolate outside (integer only).

    FORMULA: ``k`` = segment of ``c = clamp(q, b_0, b_K)``;
    ``pos = clamp(round_div((c - b_k) * mults[k], 2**shifts[k]), 0, (N-1) << F)`` (a
    rounding shift: plain ``>>`` truncates, costing up to ~0.7 more output steps),
    ``i = min(pos >> F, N-2)``, ``f = pos - (i << F)``,
    ``out = e[k,i] + round_div((e[k,i+1] - e[k,i]) * f, 2**F)``.
    Below b_0: ``e[0,0] + round_div((e[0,1]-e[0,0]) * (q-b_0) * mults[0], 2**(shifts[0]+F))``;
    above b_K likewise from ``e[K-1,N-2], e[K-1,N-1]`` at ``b_K``. Then saturate.
    """
    ent, b, mul, sh = (const_like(a, q) for a in (t.entries, t.bounds, t.mults, t.shifts))
    n, f_bits, mode = t.entries.shape[1], t.frac_bits, t.rounding
    c = clamp(q, int(t.bounds[0]), int(t.bounds[-1]))
    k = (c[..., None] >= b[1:-1]).sum(-1)
    pos = clamp(round_div((c - b[k]) * mul[k], 1 << sh[k], mode), 0, (n - 1) << f_bits)
    i = clamp(pos >> f_bits, None, n - 2)
    e0 = ent[k, i]
    out = e0 + round_div((ent[k, i + 1] - e0) * (pos - (i << f_bits)), 1 << f_bits, mode)
    d_lo, d_hi = ent[0, 1] - ent[0, 0], ent[-1, -1] - ent[-1, -2]
    lo_den, hi_den = 1 << (int(t.shifts[0]) + f_bits), 1 << (int(t.shifts[-1]) + f_bits)
    below = ent[0, 0] + round_div(d_lo * (q - b[0]) * mul[0], lo_den, mode)
    above = ent[-1, -1] + round_div(d_hi * (q - b[-1]) * mul[-1], hi_den, mode)
    out = where(q < b[0], below, where(q > b[-1], above, out))
    return clamp(out, *fp.qrange(t.out_dtype))


def lookup(table: LutTable, q):
    """Evaluate the table on integers: numpy -> int64 ndarray, torch -> int64 tensor.

    FORMULA: direct ``entries[clamp(q, qmin, qmax) - qmin]``; segmented see
    :func:`_segmented`. Inputs are saturated to the input dtype's range first.
    """
    q = q.long() if fp._is_torch(q) else np.asarray(q).astype(np.int64)
    q = clamp(q, *fp.qrange(table.in_dtype))
    if table.kind == "direct":
        return const_like(table.entries, q)[q - fp.qrange(table.in_dtype)[0]]
    if table.kind == "segmented":
        return _segmented(table, q)
    raise SimulatorError(f"unknown LUT kind {table.kind!r}", where=f"lut {table.op}")


def max_error(table: LutTable, fn: Callable, domain=None) -> dict:
    """Worst error of the table over every input integer (int16: all 65536).

    FORMULA: ``err = |lookup(q) * out_scale - clip(fn(q * in_scale), out range)|``;
    ``max_err_steps = max(err) / out_scale``. ``fn`` is clipped to what ``out_dtype`` can
    hold (saturation is not a table error). ``domain`` (real) restricts the inputs.
    """
    lo, hi = _domain_ints(table.in_dtype, table.in_scale, domain)
    q = np.arange(lo, hi + 1, dtype=np.int64)
    qmin, qmax = fp.qrange(table.out_dtype)
    with np.errstate(all="ignore"):
        ref = np.asarray(fn(q * table.in_scale), dtype=np.float64)
    ref = np.clip(ref, qmin * table.out_scale, qmax * table.out_scale)
    err = float(np.max(np.abs(lookup(table, q) * table.out_scale - ref)))
    return {"op": table.op, "in_dtype": table.in_dtype, "out_dtype": table.out_dtype,
            "kind": table.kind, "size": int(table.entries.size), "max_abs_err": err,
            "max_err_steps": err / table.out_scale}  # fmt: skip


ARRAY_FIELDS = ("entries", "bounds", "mults", "shifts")
"""The array fields of :class:`LutTable`, in the order custom ops pass them."""


def to_arrays(table: LutTable) -> dict:
    """Every field by name: the four int64 arrays plus Python scalars/strings."""
    return {f.name: getattr(table, f.name) for f in fields(LutTable)}


def from_arrays(d: dict) -> LutTable:
    """Inverse of :func:`to_arrays` (accepts 0-d arrays for the scalars)."""
    kw = {}
    for f in fields(LutTable):
        v = d[f.name]
        if f.name in ARRAY_FIELDS:
            kw[f.name] = np.asarray(v, dtype=np.int64)
        else:
            v = np.asarray(v).item() if isinstance(v, np.ndarray) else v
            kw[f.name] = {"str": str, "float": float, "int": int}[f.type](v)
    return LutTable(**kw)
