"""Integer arithmetic of the modelled Nash BPU, on numpy arrays and torch tensors alike.

This module holds the integer helpers (``const_like``, ``clamp``, ``where``), integer-exact
rounded division :func:`round_div`, the requantize multiplier :func:`fixed_multiplier`
(and :func:`aligned_multipliers` on one common shift), :func:`requantize` itself
(``clamp(round_div(acc * mult, 2**shift))``, int64 throughout) with its overflow bounds
:data:`PRODUCT_LIMIT` / :data:`MAX_SHIFT`, and :func:`max_abs`. The rounding modes and
range table they use live in :mod:`simulator.arith.fixedpoint`; torch is imported only when a
tensor is passed.
"""

from __future__ import annotations

import numpy as np

from schemas.errors import SimulatorError
from simulator.arith.fixedpoint import ROUNDING_MODES, _is_torch, _numel, qrange, round_by

# Integer helpers, the same on numpy arrays and torch tensors (int64 throughout).


def const_like(a: np.ndarray, ref):
    """A constant int64 array as the kind (numpy/torch, device) of ``ref``.

    A read-only array (a frozen table) is copied into the tensor: torch cannot share it.
    """
    if _is_torch(ref):
        import torch

        make = torch.as_tensor if np.asarray(a).flags.writeable else torch.tensor
        return make(a, dtype=torch.int64, device=ref.device)
    return np.asarray(a, dtype=np.int64)


def clamp(x, lo, hi):
    """``min(max(x, lo), hi)`` with Python-int bounds (``None`` = unbounded)."""
    if _is_torch(x):
        return x.clamp(lo, hi)
    return np.clip(x, lo, hi)


def where(cond, a, b):
    """Elementwise ``a if cond else b``."""
    if _is_torch(cond):
        import torch

        return torch.where(cond, a, b)
    return np.where(cond, a, b)


def round_div(v, d, mode: str):
    """Integer-exact ``round_by(v / d, mode)`` for integer ``v`` and positive integer ``d``.

    FORMULA: ``fl = floor(v / d)``, ``r = v - fl * d`` (``0 <= r < d``);
    ``fl + (2r > d)`` plus, on a tie ``2r == d``: half_even ``+ (fl odd)``, bpu_round
    ``+ (v > 0)`` (ties away from zero). Same tie rules as
    :func:`simulator.arith.fixedpoint.round_by`, without going through float.
    """
    if mode not in ROUNDING_MODES:
        round_by(0.0, mode)  # raises the one "unknown rounding mode" error
    k = _exponent(d)
    fl = v // d if k is None else v >> k  # ">>" on int64 is floor division by 2**k
    twice = v - fl * d
    twice *= 2  # in place from here: at 224x224 every full-size temporary costs
    up, tie = twice > d, twice == d
    del twice
    tie &= ((fl & 1) == 1) if mode == "half_even" else (v > 0)
    up |= tie
    fl += up
    return fl


def _exponent(d):
    """``log2(d)`` (same kind as ``d``) when every divisor is a power of two, else None.

    Requantize divides by ``2**shift``: a shift is many times cheaper than int64 ``//``."""
    if isinstance(d, int | np.integer):
        return int(d).bit_length() - 1 if d > 0 and d & (d - 1) == 0 else None
    if _is_torch(d):
        import torch

        if d.is_floating_point() or not bool(((d > 0) & (d & (d - 1) == 0)).all()):
            return None
        return torch.frexp(d.double())[1].long() - 1
    d = np.asarray(d)
    if d.dtype.kind not in "iu" or not bool(((d > 0) & (d & (d - 1) == 0)).all()):
        return None
    return (np.frexp(d.astype(np.float64))[1] - 1).astype(np.int64)


def ratio_limit(bits: int) -> float:
    """The ratios :func:`fixed_multiplier` represents with ``m < 2**bits`` are below this."""
    return 2.0**bits - 1


def fixed_multiplier(ratio, bits: int, rounding: str = "half_even"):
    """Integer ``(m, s)`` with ``m / 2**s ~ ratio``, ``m < 2**bits``, largest such ``s``.

    FORMULA: ``s = floor(log2((2**bits - 1) / ratio))`` (lowered by one if rounding
    carries ``m`` to ``2**bits``), ``m = round_by(ratio * 2**s)``; ``0 <= s <= 62``.
    Example: ``ratio = 0.1 / 0.2028451 (0.49299), bits = 15 -> (32308, 16)`` (the vendor example).
    """
    r = np.asarray(ratio, dtype=np.float64)
    if not (np.all(np.isfinite(r)) and np.all(r > 0)):
        raise SimulatorError(
            f"multiplier ratio {r} is zero, negative or not finite",
            where="requantize",
            hint="a scale is zero, negative or not finite: recalibrate (the layer's observer "
            "must see data) or check the scales in the model",
        )
    if np.any(r >= ratio_limit(bits)):
        raise SimulatorError(
            f"multiplier ratio {float(r.max()):.6g} is beyond the multiplier's range: "
            f"m / 2**s with m < 2**{bits} and s >= 0 holds ratios below {ratio_limit(bits):g}",
            where="requantize",
            hint="use wider multipliers, or scales whose ratio is smaller",
        )
    s = np.clip(np.floor(np.log2((2.0**bits - 1) / r)), 0, 62).astype(np.int64)
    m = round_by(r * np.exp2(s), rounding)
    s = np.where(m >= 2**bits, s - 1, s)
    m = round_by(r * np.exp2(s), rounding).astype(np.int64)
    if np.any(m == 0):
        raise SimulatorError(
            f"multiplier ratio {r} too small for a 62-bit shift",
            where="requantize",
            hint="an output scale is vastly larger than its input scales: recalibrate",
        )
    return m, s


# Requantize: integer multiplier and right shift (docs/design.md "Numerics").

PRODUCT_LIMIT = 2**62
"""Bound on ``|acc * mult|`` (and the divisor) inside :func:`requantize`: with
``|v| < 2**62`` and ``d <= 2**62``, round_div's ``v - floor(v/d)*d`` and ``2 * remainder``
stay below ``2**63``, so int64 never wraps."""
MAX_SHIFT = 62


def max_abs(x) -> int:
    """``max |x|`` as an exact Python int (0 for an empty array); safe for int64 min."""
    return max(int(x.max()), -int(x.min())) if _numel(x) else 0


def _int64(x, name: str):
    """``x`` as int64 of its own kind (torch stays torch); floats are refused."""
    if _is_torch(x):
        if x.is_floating_point():
            raise SimulatorError(f"{name} must be integer, got {x.dtype}", where="requantize")
        return x.long()
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer):
        raise SimulatorError(f"{name} must be integer, got {x.dtype}", where="requantize")
    return x.astype(np.int64, copy=False)


def _along(v, ref, axis: int | None, name: str):
    """Scalar or per-channel int64 ``v`` shaped to broadcast along ``axis`` of ``ref``."""
    v = const_like(v, ref)
    if _numel(v) == 1:
        return v.reshape(())  # one value for all: keeps a 0-d acc 0-d
    if axis is None:
        return v
    ax = axis % ref.ndim
    if _numel(v) != ref.shape[ax]:
        raise SimulatorError(
            f"{_numel(v)} values of {name} for {ref.shape[ax]} channels on axis {axis}",
            where="requantize",
            hint="pass one value per tensor or one per channel",
        )
    shape = [1] * ref.ndim
    shape[ax] = -1
    return v.reshape(shape)


def requantize(acc, mult, shift, out_dtype: str, rounding: str, axis: int | None = None):
    """Scale an integer accumulator by ``mult / 2**shift``, round once, saturate.

    FORMULA: ``clamp(round_div(acc * mult, 2**shift, rounding), qmin, qmax)`` with
    ``(qmin, qmax) = qrange(out_dtype)`` (``int32`` saturates to int32); int64 throughout.
    ``mult``/``shift`` are scalars or per-channel arrays laid along ``axis`` of ``acc``
    (``axis=None``: plain numpy broadcasting). Result: int64 of acc's kind (numpy/torch).

    No int64 overflow: BPU accumulators satisfy ``|acc| < 2**31`` and multipliers
    ``mult < 2**31``, so ``|acc * mult| < 2**62`` (:data:`PRODUCT_LIMIT`) and, with
    ``0 <= shift <= 62``, every round_div intermediate is below ``2**63``. Inputs beyond
    that (``max|acc| * max|mult| >= 2**62``, shift outside [0, 62]) raise, never wrap.
    """
    qmin, qmax = qrange(out_dtype)
    acc = _int64(acc, "acc")
    m, s = _along(mult, acc, axis, "mult"), _along(shift, acc, axis, "shift")
    if _numel(s) and (int(s.min()) < 0 or int(s.max()) > MAX_SHIFT):
        raise SimulatorError(f"shift outside [0, {MAX_SHIFT}]", where="requantize")
    if max_abs(acc) * max_abs(m) >= PRODUCT_LIMIT:
        raise SimulatorError(
            f"|acc * mult| may reach 2**62 (max|acc| {max_abs(acc)}, max|mult| {max_abs(m)})",
            where="requantize",
            hint="accumulators must fit int32 and multipliers 31 bits",
        )
    return clamp(round_div(acc * m, 2**s, rounding), qmin, qmax)


def aligned_multipliers(ratios, bits: int, rounding: str = "half_even"):
    """Multipliers on ONE common shift, each with a full ``bits``-wide mantissa.

    FORMULA: per ratio element ``(m_i, s_i) = fixed_multiplier(r_i, bits)``; the common
    shift is ``S = max s_i`` and ``M_i = m_i << (S - s_i)``, so
    ``round_div(a*M_a + b*M_b, 2**S) ~ a*r_a + b*r_b`` (r = s_input / s_out) with every
    ratio kept to ``bits`` significant bits. This is the BPU's eltwise alignment
    ``(x << k + y * qscale) >> n`` generalised: the input with the larger ratio is the one
    shifted left. (Sharing the largest ratio's shift instead would leave a small ratio, e.g.
    a fused conv's int32 accumulator, only a few bits.) Each ratio is a scalar or a
    per-channel array; returns ``([M_i int64 shaped like r_i], S)``. Raises for
    non-finite or non-positive ratios, as fixed_multiplier does.
    """
    rs = [np.asarray(r, dtype=np.float64) for r in ratios]
    if not rs or any(r.size == 0 or not np.all(np.isfinite(r) & (r > 0)) for r in rs):
        raise SimulatorError(
            f"multiplier ratios {rs} must be finite and positive (at least one)",
            where="aligned_multipliers",
            hint="a scale is zero, negative or not finite: recalibrate (the layer's observer "
            "must see data) or check the scales in the model",
        )
    parts = [fixed_multiplier(r, bits, rounding) for r in rs]
    common = int(max(int(np.max(sh)) for _, sh in parts))
    mults = [
        (np.asarray(m, np.int64) << (common - np.asarray(sh, np.int64))).reshape(r.shape)
        for (m, sh), r in zip(parts, rs, strict=True)
    ]
    return mults, common
