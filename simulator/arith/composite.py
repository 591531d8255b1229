"""Softmax and LayerNorm as the modelled BPU computes them: integer steps and int16 LUTs.

Both functions take numpy integer arrays or torch integer tensors and return int64 of the
same kind, with identical values (all arithmetic is integer, see :mod:`simulator.arith.lut`).
Scales of every intermediate are written next to each step; ``2^-15`` means the integer
``v`` stands for ``v * 2**-15``. Rounded shifts/divisions use the tables' rounding mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import clamp, const_like, fixed_multiplier, round_div
from simulator.arith.lut import LutTable, build_segmented_table, lookup

EXP_FRAC = 15
"""exp LUT output and reciprocal LUT output scale: ``2**-15`` (1.0 saturates to 32767)."""
EXP_CUTOFF = float(np.log(2.0**-17))
"""exp table domain starts here (exp = a quarter step, rounds to 0); lower d clamp to it."""
REQ_BITS = 15
"""Requantize multipliers are ``< 2**15`` (the vendor example 32308 / 2**16)."""
VAR_GUARD = 9
"""LayerNorm variance carries 9 extra fraction bits (odd, so ``2**(15 - 9)`` is a square)."""
NORM_FRAC = 16
"""LayerNorm normalized value ``(x - mean) / std`` kept with 16 fraction bits (int32)."""


def _reduce(x, op: str, axis: int):
    """``max`` or ``sum`` along ``axis`` with the axis kept, on numpy or torch."""
    if fp._is_torch(x):
        return x.amax(dim=axis, keepdim=True) if op == "max" else x.sum(dim=axis, keepdim=True)
    return getattr(x, op)(axis=axis, keepdims=True)


def _as_int(q):
    """Integer input as int64 (numpy or torch)."""
    return q.long() if fp._is_torch(q) else np.asarray(q).astype(np.int64)


def _shift_round(v, sh, mode: str):
    """``round_by(v * 2**-sh)`` for integer (array) ``sh`` of either sign, integer only."""
    left, right = clamp(-sh, 0, None), clamp(sh, 0, None)
    return round_div(v * (1 << left), 1 << right, mode)


@dataclass(frozen=True, eq=False)
class SoftmaxTables:
    """exp and reciprocal LUTs plus the fixed shifts/multipliers of int_softmax."""

    exp: LutTable  # int16 d (scale in_scale, d <= 0) -> int16 at 2^-15
    recip: LutTable  # int16 sum (scale 2^(sum_shift-15)) -> int16 at 2^-15
    sum_shift: int  # s >> sum_shift fits int16 for row sums up to n_max
    out_mult: int  # out_mult / 2^out_shift ~ 2^-30 / out_scale
    out_shift: int
    out_scale: float
    out_dtype: str
    rounding: str


def build_softmax(in_scale, in_dtype, out_scale, out_dtype, rounding, n_max, segments=6,
                  entries=64, exp_fn: Callable | None = None,
                  recip_fn: Callable | None = None, dividing="curvature") -> SoftmaxTables:  # fmt: skip
    """Tables and constants of :func:`int_softmax`.

    FORMULA: ``sum_shift = max(1, ceil(log2(n_max)))`` where ``n_max`` bounds the row sum
    of exp in real units (at most the axis length; a sum above it saturates); at least 1,
    or a one-element axis (levit's attention over one token at small input sizes) leaves
    the reciprocal table the empty domain ``[2^15 / 32767, 32767 * 2^-15]``. exp table domain
    ``[max(qmin16 * in_scale, ln 2^-17), 0]``; reciprocal table input scale
    ``2^(sum_shift - 15)``, domain from ``2^15 / 32767`` (where ``1/x`` first fits int16
    at ``2^-15``; smaller inputs saturate to 32767, correctly) to the top of int16;
    ``out_mult / 2^out_shift ~ 2^-30 / out_scale`` (15-bit multiplier).
    """
    if not n_max >= 1:
        raise SimulatorError(f"n_max {n_max} < 1", where="softmax", hint="pass the axis length")
    fp.qrange(in_dtype)
    sh = max(1, int(np.ceil(np.log2(n_max))))
    if sh > 16:
        raise SimulatorError(f"n_max {n_max} above 2**16", where="softmax")
    exp_t = build_segmented_table("exp", exp_fn or np.exp, in_scale, 2.0**-EXP_FRAC, "int16",
                                  rounding, segments=segments, entries=entries,
                                  dividing=dividing, domain=(EXP_CUTOFF, 0.0))  # fmt: skip
    r_scale = 2.0 ** (sh - EXP_FRAC)
    recip_t = build_segmented_table("reciprocal", recip_fn or (lambda x: 1.0 / x), r_scale,
                                    2.0**-EXP_FRAC, "int16", rounding, segments=segments,
                                    entries=entries, dividing=dividing,
                                    domain=(2.0**15 / 32767, 32767 * r_scale))  # fmt: skip
    m, s = fixed_multiplier(2.0 ** (-2 * EXP_FRAC) / out_scale, REQ_BITS, rounding)
    fp.qrange(out_dtype)
    return SoftmaxTables(exp_t, recip_t, sh, int(m), int(s), float(out_scale), out_dtype, rounding)


def int_softmax(q, axis: int, t: SoftmaxTables):
    """Integer softmax along ``axis``; numpy or torch in, int64 of the same kind out.

    FORMULA (scales in brackets):
    ``d = clamp(q - max(q), exp.bounds[0], 0)`` [in_scale] (int16 saturation, and exp
    below the table domain is 0); ``e = lookup(exp, d)`` [2^-15];
    ``s = sum(e)`` [2^-15, int32 for up to 2^16 terms];
    ``r_in = min(round_div(s, 2^sum_shift), 32767)`` [2^(sum_shift-15)];
    ``r = lookup(recip, r_in)`` [2^-15];
    ``out = clamp(round_div(e * r * out_mult, 2^out_shift))`` [out_scale].
    Error sources: int16 inputs whose row spread exceeds ``32768 * in_scale`` saturate d
    (exp overestimated by up to ``exp(-32768 * in_scale)``); the reciprocal input step is
    ``2^(sum_shift - 15)``, a relative error of up to ``2^(sum_shift - 16) / sum``.
    """
    q = _as_int(q)
    d = clamp(q - _reduce(q, "max", axis), int(t.exp.bounds[0]), 0)
    e = lookup(t.exp, d)
    r_in = clamp(round_div(_reduce(e, "sum", axis), 1 << t.sum_shift, t.rounding), None, 32767)
    r = lookup(t.recip, r_in)
    out = round_div(e * r * t.out_mult, 1 << t.out_shift, t.rounding)
    return clamp(out, *fp.qrange(t.out_dtype))


@dataclass(frozen=True, eq=False)
class LayerNormTables:
    """rsqrt LUT, folded weight/bias and constants of int_layernorm (last axis)."""

    rsqrt: LutTable  # int16 normalized variance (2^-15, [2^13, 2^15)) -> int16 at 2^-14
    n: int
    in_shift: int  # int8 inputs are promoted to int16 internals: q << 8 (scale s / 2^8)
    eps_fx: int  # eps at the variance scale in_scale^2 * 2^-VAR_GUARD
    weight_q: np.ndarray  # int64 [n], int16 values at 2^-weight_bits
    weight_bits: int
    bias_q: np.ndarray  # int64 [n] at 2^-(NORM_FRAC + weight_bits)
    out_mult: int  # out_mult / 2^out_shift ~ 2^-(NORM_FRAC + weight_bits) / out_scale
    out_shift: int
    out_scale: float
    out_dtype: str
    rounding: str


def build_layernorm(in_scale, in_dtype, out_scale, out_dtype, rounding, n, eps, weight=None,
                    bias=None, *, segments=6, entries=64, dividing="curvature",
                    rsqrt_fn: Callable | None = None) -> LayerNormTables:  # fmt: skip
    """Tables and constants of :func:`int_layernorm`.

    FORMULA: internal input scale ``s = in_scale * 2^-in_shift`` (``in_shift = 8`` for
    int8, the internals are int16), ``eps_fx = round(eps * 2^9 / s^2)``; rsqrt table over input integers
    ``[2^13, 2^15)`` at scale ``2^-15`` (real [0.25, 1)), output ``2^-14``;
    ``weight_bits = 15 - e`` with ``max|w| = m * 2^e`` (0.5 <= m < 1),
    ``weight_q = clamp(round(w * 2^weight_bits))`` int16; ``bias_q = round(b * 2^(16 +
    weight_bits))`` int64; ``out_mult / 2^out_shift ~ 2^-(16 + weight_bits) / out_scale``.
    """
    qmin, qmax = fp.qrange(in_dtype)
    if not 1 <= n < 2**20:
        raise SimulatorError(f"layer norm over {n} values", where="layernorm", hint="1..2**20")
    w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64).reshape(n)
    b = np.zeros(n) if bias is None else np.asarray(bias, dtype=np.float64).reshape(n)
    wb = 15 - int(np.frexp(max(float(np.abs(w).max()), fp.MIN_SCALE))[1])
    w_q = fp.quantize(w, 2.0**-wb, "int16", rounding)
    b_q = fp.round_by(b * 2.0 ** (NORM_FRAC + wb), rounding).astype(np.int64)
    rsqrt = build_segmented_table("rsqrt", rsqrt_fn or (lambda x: 1.0 / np.sqrt(x)), 2.0**-15,
                                  2.0**-14, "int16", rounding, segments=segments,
                                  entries=entries, dividing=dividing,
                                  domain=(0.25, 32767 * 2.0**-15))  # fmt: skip
    in_shift = 16 - int(np.log2(qmax - qmin + 1))
    s_int = in_scale * 2.0**-in_shift
    eps_fx = int(min(fp.round_by(eps * 2.0**VAR_GUARD / s_int**2, rounding), 2.0**40))
    m, s = fixed_multiplier(2.0 ** -(NORM_FRAC + wb) / out_scale, REQ_BITS, rounding)
    fp.qrange(out_dtype)
    return LayerNormTables(rsqrt, int(n), in_shift, eps_fx, w_q, wb, b_q, int(m), int(s),
                           float(out_scale), out_dtype, rounding)  # fmt: skip


def _normalize_var(v, mode: str):
    """Even shift ``2k`` bringing ``v > 0`` into ``[2^13, 2^15)``; returns (vn, k).

    FORMULA: ``bits = bit_length(v)`` (count of ``v >= 2^j``),
    ``k = ceil((bits - 15) / 2) = (bits - 14) // 2``,
    ``vn = min(round_div(v, 4^k), 32767)`` (``v * 4^-k`` for k < 0). ``v = 0`` gives 0.
    """
    powers = const_like(1 << np.arange(63, dtype=np.int64), v)
    k = ((v[..., None] >= powers).sum(-1) - 14) // 2
    return clamp(_shift_round(v, 2 * k, mode), 0, 32767), k


def int_layernorm(q, t: LayerNormTables):
    """Integer layer norm over the last axis; numpy or torch in, int64 of the same kind out.

    FORMULA (scales in brackets, s = in_scale 2^-in_shift, G = 9, Y = 16, W = weight_bits):
    ``x = q << in_shift`` [s]; ``mean = round_div(sum(x), n)`` [s]; ``d = q - mean`` [s, int32];
    ``v = round_div(sum(d^2) * 2^G, n) + eps_fx`` [s^2 2^-G, int64];
    ``vn, k = _normalize_var(v, mode)``, so ``v ~ vn * 4^k``;
    ``R = lookup(rsqrt, vn)`` [2^-14], real ``rsqrt(vn 2^-15)``, hence
    ``(x - mean) / std = d * R * 2^-(17 + k)`` (G = 9 makes s and 2^(15-G) cancel exactly);
    ``y = round(d * R * 2^(Y - 17 - k))`` [2^-Y]; ``z = y * weight_q + bias_q`` [2^-(Y+W)];
    ``out = clamp(round_div(z * out_mult, 2^out_shift))`` [out_scale].
    """
    x = _as_int(q) * (1 << t.in_shift)
    mode = t.rounding
    d = x - round_div(_reduce(x, "sum", -1), t.n, mode)
    v = round_div(_reduce(d * d, "sum", -1) * (1 << VAR_GUARD), t.n, mode) + t.eps_fx
    vn, k = _normalize_var(v, mode)
    r = lookup(t.rsqrt, vn)
    y = _shift_round(d * r, 17 + k - NORM_FRAC, mode)
    z = y * const_like(t.weight_q, x) + const_like(t.bias_q, x)
    out = round_div(z * t.out_mult, 1 << t.out_shift, mode)
    return clamp(out, *fp.qrange(t.out_dtype))
