"""Fused float64 requantize epilogues of the executor, with the bounds that make them exact.

The integer requantize of :func:`simulator.arith.intmath.requantize` is
``y = clamp(round_div(v * m, 2**s), lo, hi)``. Written as ``y = round(v * (m * 2**-s))``
in float64 it is exact whenever ``|v * m|`` is below
:func:`simulator.kernels.exec_kernels.exact_limit` (2**53 half_even, 2**52 bpu_round: its
``|y| + 0.5`` needs the spare bit, :func:`round_`): ``m * 2**-s`` is an exact float64
(``m < 2**53``, a power-of-two scale), the product is then an exact float64 number, and
rounding an exact value is exact. float32 epilogues: 2**24 / 2**23. Sums of such exact
terms stay exact while the bound holds for the sum, so a bias
(``(acc + bias) * m = acc*m + bias*m``) and the scale-aligned add ``a*ma + b*mb`` fold into
the same single pass.

:class:`Epilogue` holds one instruction's per-channel float64 scales, the bias, the
clamp bounds (``relu`` folded in as ``lo = max(qmin, 0)``, a fused ``clip`` as its
intersection) and the output dtype, built
once per program; :meth:`Epilogue.apply` evaluates it on one block of accumulators.
Callers prove exactness with the static bounds (:func:`acc_bound`) before using it and
otherwise keep the int64 path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.kernels.exec_kernels import TORCH_DTYPES, exact_limit

INT32 = fp.qrange("int32")


def dtype_bound(dtype: torch.dtype) -> int:
    """``max |v|`` a tensor of this integer dtype can hold (``-qmin``)."""
    return -int(torch.iinfo(dtype).min)


def acc_bound(wmat: torch.Tensor, in_dtype: torch.dtype, bias) -> int:
    """Static bound of ``|x @ wmat + bias|`` over every input of ``in_dtype``.

    FORMULA: ``max_o sum_k |wmat[k, o]| * max|x| + max|bias|``.
    """
    col = int(wmat.long().abs().sum(0).max()) if wmat.numel() else 0
    b = int(bias.long().abs().max()) if bias is not None and bias.numel() else 0
    return col * dtype_bound(in_dtype) + b


def scale_of(mult: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``m * 2**-s`` in float64 (exact: an integer below 2**53 times a power of two)."""
    s = shift.long()
    if s.numel() and (int(s.min()) < 0 or int(s.max()) > 62):
        raise SimulatorError("shift outside [0, 62]", where="requantize")
    return mult.double() * torch.pow(2.0, -s.double())


def round_(y: torch.Tensor, mode: str) -> torch.Tensor:
    """Round in place a tensor holding exact values ``y = N * 2**-s`` (integers ``N``,
    ``s >= 0``): half_even ``round``; bpu_round ``sign(y) * floor(|y| + 0.5)``.

    Exact for ``|N| < 2**(p - 1)``, ``p`` the mantissa bits (53 float64, 24 float32:
    :func:`simulator.kernels.exec_kernels.exact_limit`); half_even for ``|N| < 2**p``. ``|y| + 0.5`` is
    ``(|N| + 2**(s-1)) 2**-s`` with a numerator below ``2**p`` for ``1 <= s <= p`` (and
    ``|N| + 0.5`` for ``s = 0``), an exact float; for ``s > p``, ``|y| < 1/4`` and the sum
    stays below 1. At ``|N|`` up to ``2**p`` it is not: ``(2**53 - 1) 2**-54 + 0.5``
    rounds up to 1.
    """
    if mode == "half_even":
        return y.round_()
    if mode != "bpu_round":
        fp.round_by(0.0, mode)  # raises the one "unknown rounding mode" error
    sign = torch.sign(y)
    return y.abs_().add_(0.5).floor_().mul_(sign)


QUOTIENT_EXACT = 2**50
"""``|a|`` below this: :func:`round_quotient` equals ``intmath.round_div(a, n)``."""


def round_quotient(a: torch.Tensor, n: int, mode: str) -> torch.Tensor:
    """``round_div(a, n, mode)`` for float64 integers ``|a| < 2**50`` and an integer
    ``1 <= n < 2**50``, as ``round(fl(a / n))`` (float64 result).

    FORMULA: ``t = a / n``; a non-tie ``t`` is at least ``1/(2n)`` from every half-integer
    ``h``, while ``|fl(t) - t| <= |t| 2**-53 < 1/(8n)``, so ``fl(t)`` stays on ``t``'s side
    of ``h``, more than ``3/(8n)`` away; bpu_round's ``|fl(t)| + 0.5`` then stays below
    (or above) the integer ``k + 1 <= |t| + 1.5`` by more than its half ulp
    ``(k + 1) 2**-53 < 1/(8n) + 2**-52``. A tie ``t = h`` is an exact float. Both modes of
    :func:`round_` then give the integer rounding.
    """
    return round_(a / n, mode)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """``2.0**e`` (float64) for integer ``-1022 <= e <= 1023``, from the exponent bits
    (``torch.pow`` is a transcendental call per element). FORMULA: bits ``(e + 1023) << 52``."""
    return (e.long() + 1023).bitwise_left_shift_(52).view(torch.float64)


@dataclass(frozen=True, eq=False)
class Epilogue:
    """``y = clamp(round((acc + bias) * scale [+ b * scale_b]), lo, hi)`` cast to ``dtype``.

    ``scale`` None: no requantize (an int32 accumulator: ``clamp(acc + bias, int32)``).
    ``bias`` / ``scale`` / ``scale_b`` are float64, per channel (last axis) or scalars;
    ``lo`` already includes ``relu``.
    """

    bias: torch.Tensor | None
    scale: torch.Tensor | None
    scale_b: torch.Tensor | None
    lo: int
    hi: int
    dtype: torch.dtype
    rounding: str
    ftype: torch.dtype = torch.float64
    int_bias: torch.Tensor | None = None  # int32 output proven not to saturate: acc + this

    def apply(self, acc: torch.Tensor, b=None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The epilogue on one block ``acc [..., C]`` (and the add operand ``b``); written
        into ``out`` (same number of elements) when given, saving an int8 temporary."""
        if self.int_bias is not None and acc.dtype == torch.int32:
            y = acc.add_(self.int_bias)  # in place on the GEMM's output
            y = y.clamp_(min=self.lo) if self.lo > INT32[0] else y  # relu
            return y if out is None else out.copy_(y.view(out.shape))
        y = acc.to(self.ftype)  # one dtype per op: mixed-dtype kernels are not vectorized
        y = y if self.bias is None else y.add_(self.bias)
        if self.scale is not None:
            y.mul_(self.scale)
            if b is not None:
                y.addcmul_(b, self.scale_b)  # b*scale_b without a temporary
            round_(y, self.rounding)
        y = y.clamp_(self.lo, self.hi)
        return y.to(self.dtype) if out is None else out.copy_(y.view(out.shape))


def out_range(attrs: dict) -> tuple[int, int]:
    """``(lo, hi)`` of ``attrs["out_dtype"]`` with ``relu`` folded in (``lo = max(qmin,
    0)``) and a fused ``clip`` (``[c_lo, c_hi]``, ``c_lo <= 0 <= c_hi``: the intervals
    meet, so clamping to both in turn is clamping to their intersection)."""
    lo, hi = fp.qrange(attrs["out_dtype"])
    lo = max(lo, 0) if int(attrs.get("relu") or 0) else lo
    if attrs.get("clip") is not None:
        c_lo, c_hi = (int(v) for v in attrs["clip"])
        if not c_lo <= 0 <= c_hi:
            raise SimulatorError(f"clip {[c_lo, c_hi]} does not contain 0", where="attrs.clip",
                                 hint="compile fuses only clips with lo <= 0 <= hi")  # fmt: skip
        lo, hi = max(lo, c_lo), min(hi, c_hi)
    return lo, hi


def epilogue(attrs: dict, bias, mult, shift, mult_b=None) -> Epilogue:
    """The :class:`Epilogue` of ``attrs`` (out_dtype, relu, rounding) and the constants.

    ``mult``/``shift`` empty: int32 output, saturate only (as :func:`int_ops._requant`).
    With ``mult_b`` (a fused add) ``mult`` is the add's ``ma`` and ``shift`` its shift.
    """
    lo, hi = out_range(attrs)
    has_bias = bias is not None and bias.numel() > 0
    scale = None
    if mult is not None and mult.numel() and shift.numel():
        scale = scale_of(mult.reshape(-1), shift.reshape(-1))
    elif attrs["out_dtype"] != "int32":
        raise SimulatorError(f"no mult/shift but out_dtype {attrs['out_dtype']}")
    scale_b = None if mult_b is None else scale_of(mult_b.reshape(-1), shift.reshape(-1))
    return Epilogue(bias.double().reshape(-1) if has_bias else None, scale, scale_b, lo, hi,
                    TORCH_DTYPES[attrs["out_dtype"]], attrs["rounding"])  # fmt: skip


def add_epilogue(attrs: dict, a_dtype, b_dtype, ma, mb, shift) -> Epilogue | None:
    """QAdd ``clamp(round_div(a*ma + b*mb, 2**shift))`` as an :class:`Epilogue` on
    ``(a, b)``, or None when not provably exact.

    FORMULA of the bound: ``V = max|a| * max|ma| + max|b| * max|mb|`` from the dtypes;
    float32 / float64 below their :func:`exact_limit`. ``ma``/``mb`` keep their
    broadcasting shapes (per channel ``[C, 1, 1]`` or flattened on the nhwc last axis).
    """
    if shift.numel() != 1:
        return None
    bound = dtype_bound(a_dtype) * int(ma.abs().max()) + dtype_bound(b_dtype) * int(mb.abs().max())
    mode = attrs["rounding"]
    if bound >= exact_limit(mode):
        return None
    ftype = torch.float32 if bound < exact_limit(mode, torch.float32) else torch.float64
    lo, hi = out_range(attrs)
    sa, sb = scale_of(ma, shift.reshape(())), scale_of(mb, shift.reshape(()))
    return Epilogue(None, sa.to(ftype), sb.to(ftype), lo, hi, TORCH_DTYPES[attrs["out_dtype"]],
                    attrs["rounding"], ftype)  # fmt: skip


def gemm_epilogue(attrs: dict, wmat, in_dtype, bias, mult, shift) -> Epilogue | None:
    """The :class:`Epilogue` of ``req(x @ wmat + bias, mult, shift)``, or None when
    ``acc_bound(wmat, in_dtype, bias) * max|mult|`` reaches :func:`exact_limit`.

    int32 output (no mult/shift) with ``acc_bound < 2**31``: the saturation is a no-op, so
    an int32 accumulator gets ``acc + bias`` in int32, in place (``int_bias``)."""
    epi = epilogue(attrs, bias, mult, shift)
    m = int(mult.abs().max()) if epi.scale is not None else 1
    bound = acc_bound(wmat, in_dtype, bias)
    if epi.scale is None and bound <= INT32[1]:
        zero = torch.zeros(wmat.shape[1], dtype=torch.int32)  # int32 acc + bias cannot wrap
        b = zero if epi.bias is None else epi.bias.to(torch.int32)
        return dataclasses.replace(epi, int_bias=b)
    return epi if bound * m < exact_limit(attrs["rounding"]) else None


def scaled_epilogue(attrs: dict, bound: int, mult, shift, shape) -> Epilogue | None:
    """``req(v, mult, shift)`` for a value with ``|v| <= bound`` (QMul's product, QRequant's
    input): ``mult``/``shift`` already shaped to broadcast; None from the float64
    :func:`exact_limit` up, float32 below the float32 one."""
    mode = attrs["rounding"]
    top = bound * int(mult.abs().max()) if mult.numel() and shift.numel() else 2**64
    if top >= exact_limit(mode):
        return None
    lo, hi = out_range(attrs)
    ftype = torch.float32 if top < exact_limit(mode, torch.float32) else torch.float64
    scale = scale_of(mult.reshape(shape(mult)), shift.reshape(shape(shift))).to(ftype)
    return Epilogue(None, scale, None, lo, hi, TORCH_DTYPES[attrs["out_dtype"]], attrs["rounding"],
                    ftype)  # fmt: skip
