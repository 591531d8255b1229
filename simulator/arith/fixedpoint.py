"""Fixed-point primitives of the modelled Nash BPU: rounding, ranges, scales, fake quant.

This module holds the rounding modes (``round_half_even``, ``round_half_away``,
``round_by``), the range table ``qrange``, calibration scales (``symmetric_scale``,
``pot_scale``), ``fake_quantize`` and ``quantize``; the integer arithmetic built on them
(``round_div``, ``requantize``, multipliers) is :mod:`simulator.arith.intmath`.
It is the ONE implementation of these formulas. Torch fake quant (stages/) and
the integer simulator both call it, so a rounding rule cannot drift between them.

Every function takes numpy arrays or torch tensors (and plain Python numbers, treated as
numpy) and returns the same kind. Torch is imported lazily and only when a tensor is
passed, so the simulator stays importable without touching torch-side stage code.

Conventions (see docs/design.md "Numerics"):

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
    Accepts a number or an array of per-channel ``amax``; NaN/inf/negative amax, and an
    amax so close to the float limit that the scale overflows (``2 * amax`` in float32),
    raise :class:`SimulatorError`.
    """
    qmin, qmax = qrange(dtype)
    a = _as_float(amax)
    _check_finite("amax", a)
    if bool((a < 0).any()):
        raise SimulatorError("amax is negative", where="amax", hint="pass max(|x|)")
    scale = _clip(2 * a / (qmax - qmin), MIN_SCALE, float("inf"))
    finite = scale.isfinite().all() if _is_torch(scale) else np.isfinite(scale).all()
    if not bool(finite):
        raise SimulatorError(
            f"max |x| = {float(a.max()):.4g} gives an infinite {dtype} scale",
            where="amax",
            hint="a value near the float limit reached this tensor (an attention mask "
            "written as (1 - mask) * torch.finfo(dtype).min?): use a moderate constant "
            "such as -1e4 for masked positions",
        )
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
    q = round_by(x / s, mode)  # a new array: torch clamps it in place (a 224x224 copy less)
    return (q.clamp_(qmin, qmax) if _is_torch(q) else np.clip(q, qmin, qmax)), s


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
    return q.mul_(s) if _is_torch(q) else q * s


def quantize(x: Array, scale: Array, dtype: str, mode: str, ch_axis: int | None = None) -> Array:
    """Integer values of ``x``: numpy int64, torch int32.

    FORMULA: ``clamp(round(x / s), qmin, qmax)`` (see :func:`fake_quantize` for ``s``);
    NaN (a float island's ``0 / 0``) gives ``qmin``, as ONNX's QuantizeLinear does on x86
    (``rint(NaN)`` casts to INT_MIN, then saturates). The clamp is repeated in float64
    before the cast, because float32 cannot hold ``2**31 - 1`` and casting an out-of-range
    float (or NaN) is undefined.
    """
    qmin, qmax = qrange(dtype)
    q, _ = _quantize_float(x, scale, dtype, mode, ch_axis)
    if _is_torch(q):
        import torch

        return torch.nan_to_num(q.double(), nan=qmin).clamp(qmin, qmax).to(torch.int32)
    return np.clip(np.nan_to_num(q.astype(np.float64), nan=qmin), qmin, qmax).astype(np.int64)
