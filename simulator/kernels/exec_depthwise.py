"""The executor's depthwise convolution through the compiled kernel (simulator/csrc/qdw.c).

A 2-D CONV whose ``group`` equals its input and output channels (channel multiplier 1:
MobileNet's depthwise 3x3), on an int8 input, without a fused add, with a requantizing
epilogue proven exact, runs here, in either layout: the compiler gives grouped convs the
plain NCHW layout, whose buffers are then NCHW views of NHWC memory (``ToNCHW`` re-views
an nhwc buffer, and this kernel's output is returned as such a view); everything else keeps the int64 path of
:func:`simulator.kernels.exec_ops.k_conv` (a block-diagonal GEMM: ``group`` times the work).

FORMULA: ``acc[n, p, c] = sum_{i, j} x_pad[n, p*stride + (i, j)*dilation, c] * w[c, i, j]
+ bias[c]`` (exact int32), then ``y = clamp(round(acc * scale[c]), lo, hi)`` in float32
or float64, with the bounds of :mod:`simulator.kernels.exec_native`: ``A = acc_bound <
2**31`` and ``T = A * max|mult| < exact_limit(mode, ftype)``, float32 when ``T`` is below
the float32 limit or :func:`~simulator.kernels.exec_native.magic32` holds. The padding is
zero: taps outside the input are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.kernels import exec_kernels as ek
from simulator.kernels.exec_epilogue import acc_bound, gemm_epilogue
from simulator.kernels.exec_kernels import exact_limit
from simulator.kernels.exec_native import OUT_DTYPES, lanes, scale_lanes
from simulator.program.isa import Instruction
from simulator.runtime import native

BLOCK = 32
"""Channels per kernel block: one 512-bit register of int16 inputs."""


@dataclass(frozen=True, eq=False)
class DepthwisePlan:
    """One depthwise conv's operands in the kernel's layout (module docstring)."""

    weights: torch.Tensor  # int16 [kh, kw, Cb, 2, 32]: even / odd lanes (pair_weights)
    corr: torch.Tensor  # int32 [Cb * 32]: the bias
    scale: torch.Tensor  # float32 / float64 [Cb * 32]
    channels: int  # C = group
    kernel: tuple[int, int]
    geometry: tuple[list[int], list[int], list[int]]  # strides, pads, dilations
    lo: int
    hi: int
    half_even: bool
    out_dtype: torch.dtype
    mode: int  # the epilogue's code (exec_native.scale_lanes)


def conv(instr: Instruction, x: torch.Tensor, consts) -> torch.Tensor | None:
    """The depthwise CONV ``instr`` on ``x`` (nhwc, or plain NCHW), or None when the kernel
    does not apply (then the caller runs the int64 path)."""
    nhwc = instr.attrs.get("layout") == "nhwc"
    plan = consts.cached(("dw_plan", instr.outputs[0], x.dtype, nhwc),
                         lambda: build(instr, consts, x.dtype, nhwc))  # fmt: skip
    if plan is None:
        return None
    if nhwc:
        return run(plan, x)
    return run(plan, x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def build(instr: Instruction, consts, in_dtype: torch.dtype, nhwc: bool) -> DepthwisePlan | None:
    """The :class:`DepthwisePlan` of a depthwise CONV (weights ``[C, kh, kw, 1]`` nhwc, ONNX's
    ``[C, 1, kh, kw]`` plain; group ``C``), or None when the kernel does not apply (module
    docstring)."""
    w, bias, mult, shift = (consts[c] if c else None for c in instr.consts[:4])
    if w.ndim != 4:
        return None
    w = w if nhwc else w.permute(0, 2, 3, 1)
    c = int(instr.attrs.get("group") or 1)
    if native.library() is None or in_dtype != torch.int8 or w.shape[0] != c or w.shape[3] != 1:
        return None
    wmat = w[..., 0].reshape(c, -1).t().contiguous()  # [kh*kw, C]: one column per channel
    bias = bias.reshape(-1)[:c] if bias is not None and bias.numel() else None
    mult, shift = (v if v is None or v.numel() <= 1 else v.reshape(-1)[:c] for v in (mult, shift))
    if mult is None or shift is None or not mult.numel() or not shift.numel():
        return None  # no requantize: an int32 output, kept on the int64 path
    epi = gemm_epilogue(instr.attrs, wmat, in_dtype, bias, mult, shift)
    if epi is None or epi.scale is None or epi.dtype not in OUT_DTYPES:
        return None
    a = acc_bound(wmat, in_dtype, bias)
    top = a * int(mult.abs().max())
    if a >= 2**31 or epi.rounding not in fp.ROUNDING_MODES or top >= exact_limit(epi.rounding):
        return None
    b = bias.long() if bias is not None else torch.zeros(c, dtype=torch.long)
    scale, _, mode = scale_lanes(epi, c, a, top, block=BLOCK)
    return DepthwisePlan(pair_weights(w[..., 0]), lanes(b, c, torch.int32, BLOCK), scale, c,
                         tuple(w.shape[1:3]), ek.geometry(2, instr.attrs), epi.lo, epi.hi,
                         epi.rounding == "half_even", epi.dtype, mode)  # fmt: skip


def pair_weights(w: torch.Tensor) -> torch.Tensor:
    """``w [C, kh, kw]`` int8 as the kernel's int16 ``[kh, kw, Cb, 2, 32]``: per tap and
    block of 32 channels, the weights at the even lanes (odd lanes 0), then at the odd lanes
    (even lanes 0), so VPDPWSSD's pair sums keep even and odd channels apart; zeros past C."""
    c, kh, kw = w.shape
    cb = -(-c // BLOCK)
    flat = torch.zeros(kh, kw, cb * BLOCK, dtype=torch.int16)
    flat[..., :c] = w.permute(1, 2, 0).to(torch.int16)
    flat = flat.reshape(kh, kw, cb, 1, BLOCK)
    parity = torch.arange(BLOCK) % 2 == torch.arange(2).reshape(2, 1)  # [2, 32]: even, odd
    return (flat * parity).contiguous()


def run(plan: DepthwisePlan, x: torch.Tensor) -> torch.Tensor:
    """The conv of ``plan`` on ``x [N, H, W, C]`` int8: ``[N, OH, OW, C]`` of its out dtype."""
    x = x.contiguous()
    n, h, w, cx = x.shape
    (kh, kw), (strides, pads, dil) = plan.kernel, plan.geometry
    oh = ek.out_size(h, kh, strides[0], pads[0] + pads[2], dil[0])
    ow = ek.out_size(w, kw, strides[1], pads[1] + pads[3], dil[1])
    if oh < 1 or ow < 1 or cx < plan.channels:
        raise SimulatorError(f"depthwise conv {plan.kernel} over {plan.channels} channels "
                             f"does not fit its input {tuple(x.shape)}")  # fmt: skip
    out = native.empty((n, oh, ow, plan.channels), plan.out_dtype)
    native.library().qp_dwconv(
        native.ptr(x), n, h, w, cx, plan.channels, native.ptr(plan.weights), kh, kw,
        *strides, *dil, pads[0], pads[1], oh, ow, native.ptr(plan.corr), native.ptr(plan.scale),
        plan.mode, plan.lo, plan.hi, int(plan.half_even), native.ptr(out), native.code(out),
        plan.channels)  # fmt: skip
    return out
