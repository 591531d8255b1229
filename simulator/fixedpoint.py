"""Fixed-point primitives of the modelled Nash BPU: rounding, ranges, scales, fake quant.

This module is the ONE implementation of these formulas. Torch fake quant (stages/) and
the integer simulator both call it, so a rounding rule cannot drift between them.

Every function takes numpy arrays or torch tensors (and plain Python numbers, treated as
numpy) and returns the same kind. Torch is imported lazily and only when a tensor is
passed, so the simulator stays importable without touching torch-side stage code.

Conventions (see DESIGN.md "Numerics"):

- symmetric quantization, zero point 0; ``qrange`` is the one range table;
- ``q = clamp(round(x / s), qmin, qmax)``, ``fake_quant(x) = q * s``;
- ``round`` is one of :data:`ROUNDING_MODES`, spelled out below;
- scales are positive and at least :data:`MIN_SCALE`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.errors import SimulatorError

ROUNDING_MODES = ("half_even", "bpu_round")
"""``half_even``: ties to even (training default). ``bpu_round``: ties away from zero."""

QRANGES: dict[str, tuple[int, int]] = {
    "int8": (-128, 127),
    "int16": (-32768, 32767),
    "int32": (-(2**31), 2**31 - 1),
}
"""The one range table. Weights use the same full ranges as activations (int8 -128..127)."""

MIN_SCALE = 2.0**-24
"""Smallest scale we ever produce. A power of two (so pot_scale keeps it), exactly
representable in float16/float32, and far below any useful step: an all-zero tensor gets
this scale instead of 0 (which would divide by zero)."""

Array = Any  # numpy.ndarray | torch.Tensor; kept loose to avoid importing torch here


def _is_torch(x: Array) -> bool:
    """True for torch tensors (and Parameters), without importing torch."""
    return type(x).__module__.split(".")[0] == "torch"


def _asarray(x: Array) -> Array:
    """Torch tensors pass through; everything else becomes a numpy array."""
    return x if _is_torch(x) else np.asarray(x)


def _like(value: Array, ref: Array) -> Array:
    """``value`` (a scalar or array) as the kind and float dtype of ``ref``."""
    if _is_torch(ref):
        import torch

        return torch.as_tensor(value, dtype=ref.dtype, device=ref.device)
    return np.asarray(value, dtype=np.asarray(ref).dtype)


def _numel(x: Array) -> int:
    return x.numel() if _is_torch(x) else x.size


def _trunc(x: Array) -> Array:
    return x.trunc() if _is_torch(x) else np.trunc(x)


def _clip(x: Array, lo: float, hi: float) -> Array:
    return x.clamp(lo, hi) if _is_torch(x) else np.clip(x, lo, hi)


def round_half_even(x: Array) -> Array:
    """Round to nearest, ties to even: ``2.5 -> 2``, ``3.5 -> 4``, ``-2.5 -> -2``.

    FORMULA: ``r = nearest integer to x; if |x - floor(x)| == 0.5: r = the even one``.
    IEEE-754 roundTiesToEven (``np.rint`` / ``torch.round``); exact for every float.
    """
    x = _asarray(x)
    return x.round() if _is_torch(x) else np.rint(x)


def round_half_away(x: Array) -> Array:
    """Round to nearest, ties away from zero: ``2.5 -> 3``, ``-2.5 -> -3``.

    FORMULA: ``sign(x) * floor(|x| + 0.5)``.

    This is ``bpu_round``. The vendor does not publish the hardware's tie rule (only that
    it differs from training's half-to-even); half away from zero is our choice and a
    setting, not a fact. Computed as ``t + sign(x) * (|x - t| >= 0.5)`` with
    ``t = trunc(x)``: ``x - t`` is exact, whereas ``|x| + 0.5`` itself rounds (it sends the
    float just below 0.5, and odd integers above 2**23 in float32, one step too far).
    """
    x = _asarray(x)
    t = _trunc(x)
    frac = x - t
    step = (abs(frac) >= 0.5).to(x.dtype) if _is_torch(x) else (np.abs(frac) >= 0.5)
    sign = x.sign() if _is_torch(x) else np.sign(x)
    return t + sign * step


def round_by(x: Array, mode: str) -> Array:
    """Round with the named mode: ``half_even`` or ``bpu_round`` (half away from zero)."""
    if mode == "half_even":
        return round_half_even(x)
    if mode == "bpu_round":
        return round_half_away(x)
    raise SimulatorError(
        f"unknown rounding mode {mode!r}",
        where="rounding",
        hint=f"use one of {', '.join(ROUNDING_MODES)}",
    )


def qrange(dtype: str) -> tuple[int, int]:
    """``(qmin, qmax)`` of a quantized dtype: int8 -> (-128, 127), int16, int32 likewise.

    FORMULA: ``qmin = -2**(bits-1)``, ``qmax = 2**(bits-1) - 1`` (full symmetric range).
    """
    try:
        return QRANGES[dtype]
    except KeyError:
        raise SimulatorError(
            f"unknown quantized dtype {dtype!r}",
            where="dtype",
            hint=f"use one of {', '.join(QRANGES)}",
        ) from None


def _as_float(x: Array) -> Array:
    """x as an array of its own float dtype (integers become float64 / torch float32)."""
    x = _asarray(x)
    if _is_torch(x):
        return x if x.is_floating_point() else x.float()
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float64)


def _check_finite(name: str, value: Array) -> None:
    """Raise SimulatorError if ``value`` holds NaN or +-inf (the caller adds the layer)."""
    finite = value.isfinite().all() if _is_torch(value) else np.isfinite(value).all()
    if not bool(finite):
        raise SimulatorError(
            f"{name} is NaN or infinite",
            where=name,
            hint="the observed tensor held NaN/Inf or calibration saw no data",
        )


def symmetric_scale(amax: Array, dtype: str) -> Array:
    """Calibration scale from the largest magnitude seen (per tensor or per channel).

    FORMULA (vendor): ``scale = max(2 * amax / (qmax - qmin), MIN_SCALE)``;
    int8: ``2 * amax / 255``. ``amax == 0`` (or tiny) gives :data:`MIN_SCALE`.
    Accepts a number or an array of per-channel ``amax``; NaN/inf/negative amax raise
    :class:`SimulatorError`.
    """
    qmin, qmax = qrange(dtype)
    a = _as_float(amax)
    _check_finite("amax", a)
    if bool((a < 0).any()):
        raise SimulatorError("amax is negative", where="amax", hint="pass max(|x|)")
    scale = _clip(2 * a / (qmax - qmin), MIN_SCALE, float("inf"))
    return float(scale) if isinstance(amax, int | float) else scale


def pot_scale(scale: Array) -> Array:
    """The smallest power of two ``>= scale`` (consistency levels 1 and 2).

    FORMULA: ``2 ** ceil(log2(scale))``, computed exactly with frexp
    (``scale = m * 2**e``, ``0.5 <= m < 1``: result ``2**(e-1)`` if ``m == 0.5`` else ``2**e``).
    Ceil, not round: a smaller scale would shrink ``qmax * scale`` below the calibrated
    range and saturate the largest values; ceil keeps the range covered at the cost of a
    step at most 2x coarser. (The vendor does not publish its choice.)
    """
    s = _as_float(scale)
    _check_finite("scale", s)
    if bool((s <= 0).any()):
        raise SimulatorError("scale must be positive", where="scale")
    if _is_torch(s):
        m, e = s.frexp()
        return (m == 0.5).to(s.dtype).neg().add(e.to(s.dtype)).exp2()
    m, e = np.frexp(s)
    out = np.ldexp(np.ones_like(s), e - (m == 0.5))
    return float(out) if isinstance(scale, int | float) else out


def _broadcast_scale(scale: Array, x: Array, ch_axis: int | None) -> Array:
    """Scale shaped to broadcast against ``x``: one value per tensor, ``[C]`` along ch_axis."""
    s = _like(scale, x)
    if ch_axis is None:
        if _numel(s) != 1:
            raise SimulatorError(
                f"per-tensor quantization got {_numel(s)} scales",
                where="scale",
                hint="pass ch_axis for per-channel scales",
            )
        return s.reshape(())
    axis = ch_axis % x.ndim
    if _numel(s) not in (1, x.shape[axis]):
        raise SimulatorError(
            f"{_numel(s)} scales for {x.shape[axis]} channels on axis {ch_axis}",
            where="scale",
        )
    shape = [1] * x.ndim
    shape[axis] = -1
    return s.reshape(shape)


def _quantize_float(x: Array, scale: Array, dtype: str, mode: str, ch_axis: int | None):
    """``clamp(round(x / s), qmin, qmax)`` kept in x's float dtype, plus the shaped scale."""
    qmin, qmax = qrange(dtype)
    x = _as_float(x)
    s = _broadcast_scale(scale, x, ch_axis)
    return _clip(round_by(x / s, mode), qmin, qmax), s


def fake_quantize(
    x: Array, scale: Array, dtype: str, mode: str, ch_axis: int | None = None
) -> Array:
    """Quantize and dequantize in float: what training and QAT see.

    FORMULA: ``clamp(round(x / s), qmin, qmax) * s`` with ``(qmin, qmax) = qrange(dtype)``,
    ``round = round_by(., mode)``; per tensor ``s`` is a scalar (or shape [1]), per channel
    ``s`` has shape [C] and is broadcast along ``ch_axis``. Division, as the vendor
    formula writes it (torch's converted q/dq ops multiply by ``1/s`` instead, which can
    differ by one ulp for scales that are not powers of two). Result has x's dtype; NaN
    propagates. Pure: no autograd handling here.
    """
    q, s = _quantize_float(x, scale, dtype, mode, ch_axis)
    return q * s


def quantize(x: Array, scale: Array, dtype: str, mode: str, ch_axis: int | None = None) -> Array:
    """Integer values of ``x``: numpy int64, torch int32.

    FORMULA: ``clamp(round(x / s), qmin, qmax)`` (see :func:`fake_quantize` for ``s``).
    The clamp is repeated in float64 before the cast, because float32 cannot hold
    ``2**31 - 1`` and casting an out-of-range float is undefined.
    """
    qmin, qmax = qrange(dtype)
    q, _ = _quantize_float(x, scale, dtype, mode, ch_axis)
    if _is_torch(q):
        import torch

        return q.double().clamp(qmin, qmax).to(torch.int32)
    return np.clip(q.astype(np.float64), qmin, qmax).astype(np.int64)


# Integer helpers, the same on numpy arrays and torch tensors (int64 throughout).


def const_like(a: np.ndarray, ref):
    """A constant int64 array as the kind (numpy/torch, device) of ``ref``."""
    if _is_torch(ref):
        import torch

        return torch.as_tensor(a, dtype=torch.int64, device=ref.device)
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
    :func:`simulator.fixedpoint.round_by`, without going through float.
    """
    if mode not in ROUNDING_MODES:
        round_by(0.0, mode)  # raises the one "unknown rounding mode" error
    fl = v // d
    twice = 2 * (v - fl * d)
    tie = twice == d
    extra = tie & ((fl & 1) == 1) if mode == "half_even" else tie & (v > 0)
    return fl + (twice > d) + extra


def fixed_multiplier(ratio, bits: int, rounding: str = "half_even"):
    """Integer ``(m, s)`` with ``m / 2**s ~ ratio``, ``m < 2**bits``, largest such ``s``.

    FORMULA: ``s = floor(log2((2**bits - 1) / ratio))`` (lowered by one if rounding
    carries ``m`` to ``2**bits``), ``m = round_by(ratio * 2**s)``; ``0 <= s <= 62``.
    Example: ``ratio = 0.1 / 0.2028451 (0.49299), bits = 15 -> (32308, 16)`` (the vendor example).
    """
    r = np.asarray(ratio, dtype=np.float64)
    if not (np.all(np.isfinite(r)) and np.all(r > 0) and np.all(r < 2.0**bits - 1)):
        raise SimulatorError(f"multiplier ratio {r} outside (0, 2**{bits} - 1)")
    s = np.clip(np.floor(np.log2((2.0**bits - 1) / r)), 0, 62).astype(np.int64)
    m = round_by(r * np.exp2(s), rounding)
    s = np.where(m >= 2**bits, s - 1, s)
    m = round_by(r * np.exp2(s), rounding).astype(np.int64)
    if np.any(m == 0):
        raise SimulatorError(f"multiplier ratio {r} too small for a 62-bit shift")
    return m, s


# Requantize: integer multiplier and right shift (DESIGN.md "Numerics").

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
            f"ratios {rs} must be finite and positive", where="aligned_multipliers"
        )
    parts = [fixed_multiplier(r, bits, rounding) for r in rs]
    common = int(max(int(np.max(sh)) for _, sh in parts))
    mults = [
        (np.asarray(m, np.int64) << (common - np.asarray(sh, np.int64))).reshape(r.shape)
        for (m, sh), r in zip(parts, rs, strict=True)
    ]
    return mults, common
