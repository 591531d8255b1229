"""The fast NHWC convolution of the executor: real input channels, blocked im2col + int8 GEMM
+ fused float64 epilogue, and the fused conv + add instruction.

A CONV instruction in the nhwc layout with ``group == 1`` and an int8 input runs here
when its float64 epilogue is proven exact (:mod:`simulator.kernels.exec_epilogue`); everything
else keeps :func:`simulator.kernels.exec_ops.k_conv`. Per instruction a :class:`ConvPlan` is built
once per program and input dtype:

- Input channels: the input buffer's :class:`~simulator.program.isa.Layout` says how many of its
  ``C_pad`` channels are real; the GEMM uses only those (``K = kh * kw * C`` instead of
  ``kh * kw * C_pad``: 147 instead of 784 for a 3-channel 7x7 stem). Padding channels hold
  0, so dropping them from both operands changes no sum. Output channels beyond the real
  ``O`` (multiplier 0 in the packing, so always 0) are written as 0 without computing.
- Short im2col runs: a conv whose kernel rows are fewer than :data:`DIRECT_RUN_BYTES`
  bytes (``kw * C``: a 1-channel stem) runs as one oneDNN float32 convolution when
  ``acc_bound < 2**24`` proves it exact (:func:`direct_weight`); the blocks then only
  slice its accumulator.
- Blocks: output rows are processed in blocks of about :data:`BLOCK_ELEMS` accumulators
  (whole images, or bands of output rows of one image), so the im2col copy, the int32
  accumulator and the float64 epilogue of a block stay in cache.
- Fused conv + add (``len(inputs) == 2``; consts ``w, bias, mult, shift, ma, mb,
  add_shift``): FORMULA ``acc = clamp(conv_int(x, w) + bias, int32)`` (the conv's int32
  output: ``mult``/``shift`` empty), then QAdd ``y = clamp(round_div(acc*ma + b*mb,
  2**add_shift))``, relu, cast -- exactly :func:`simulator.arith.int_ops.qconv` into
  :func:`simulator.arith.int_ops.qadd`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from schemas.errors import SimulatorError
from simulator.kernels import exec_kernels as ek
from simulator.kernels import exec_native
from simulator.kernels.exec_epilogue import (
    INT32,
    Epilogue,
    acc_bound,
    dtype_bound,
    epilogue,
    gemm_epilogue,
)
from simulator.kernels.exec_kernels import FLOAT32_EXACT, exact_limit
from simulator.program.isa import Instruction
from simulator.runtime import native

BLOCK_ELEMS = 2**17
"""Accumulators per block (1 MB of float64): small enough for the cache, large enough for
the GEMM and two threads."""


@dataclass(frozen=True, eq=False)
class ConvPlan:
    """One conv's constants in GEMM form and its epilogue (module docstring)."""

    wmat: torch.Tensor  # int8 [kh*kw*C, O], C the real input channels
    channels: int  # real input channels C
    out_channels: int  # real output channels O
    out_padded: int  # stored output channels O_pad
    kernel: tuple[int, int]
    geometry: tuple[list[int], list[int], list[int]]  # strides, pads, dilations
    epi: Epilogue
    w_f32: torch.Tensor | None = None  # set: run as one float32 conv (:func:`direct_weight`)
    native: exec_native.NativeConv | None = None  # set: run by the compiled kernel


def _real(n: int, layout) -> int:
    """Real channel count of a buffer with ``n`` stored channels (its layout may say)."""
    return layout.channels if layout is not None and 0 < layout.channels <= n else n


def build_plan(instr: Instruction, consts, in_dtype: torch.dtype, b_dtype) -> ConvPlan | None:
    """The :class:`ConvPlan` of an nhwc group-1 conv, or None when the float64 epilogue
    cannot be proven exact (then the int64 path runs).

    FORMULA of the bounds: conv ``A = acc_bound(wmat, in_dtype, bias)``; plain conv needs
    ``A * max|mult| < exact_limit``; fused add needs ``A < 2**31`` (the int32 clamp is then a
    no-op) and ``A * max|ma| + max|b| * max|mb| < exact_limit`` (2**53 half_even, 2**52
    bpu_round).
    """
    w, bias, mult, shift = (consts[c] if c else None for c in instr.consts[:4])
    c = _real(w.shape[3], consts.layouts.get(instr.inputs[0]))
    o = _real(w.shape[0], consts.layouts.get(instr.outputs[0]))
    wmat = w[:o, :, :, :c].reshape(o, -1).t().contiguous()
    bias = bias[:o] if bias is not None and bias.numel() else None
    a, mult, shift = acc_bound(wmat, in_dtype, bias), _first(mult, o), _first(shift, o)
    if b_dtype is None:
        epi = gemm_epilogue(instr.attrs, wmat, in_dtype, bias, mult, shift)
        top = a * (int(mult.abs().max()) if epi is not None and epi.scale is not None else 1)
    else:
        epi, top = fused_add_epilogue(instr, consts, bias, a, o, b_dtype) or (None, 0)
    if epi is None:
        return None
    geometry = ek.geometry(2, instr.attrs)
    kernel = tuple(w.shape[1:3])
    conv = ConvPlan(wmat, c, o, w.shape[0], kernel, geometry, epi)
    unit_w = geometry[2][1] == 1
    if nc := exec_native.plan(wmat, kernel, c, in_dtype, epi, bias, b_dtype, a, top, unit_w):
        return dataclasses.replace(conv, native=nc)
    return dataclasses.replace(conv, w_f32=direct_weight(wmat, kernel, in_dtype))


def fused_add_epilogue(instr: Instruction, consts, bias, a: int, o: int, b_dtype):
    """``(epilogue, T)`` of a conv or linear fused with an add (consts ``w, bias, mult,
    shift, ma, mb, add_shift``) whose accumulator is bounded by ``A = a``, or None: the
    conv/linear requantizes itself (not the fused form), or a bound fails.

    FORMULA: ``A < 2**31`` (the int32 clamp is then a no-op) and ``T = A * max|ma| +
    max|b| * max|mb| < exact_limit`` (2**53 half_even, 2**52 bpu_round)."""
    mult, shift = (consts[c] if c else None for c in instr.consts[2:4])
    if (mult is not None and mult.numel()) or (shift is not None and shift.numel()):
        return None
    ma, mb, add_shift = (_first(consts[n], o) for n in instr.consts[4:7])
    epi = epilogue(instr.attrs, bias, ma, add_shift, mb)
    top = a * int(ma.abs().max()) + dtype_bound(b_dtype) * int(mb.abs().max())
    return (epi, top) if a <= INT32[1] and top < exact_limit(instr.attrs["rounding"]) else None


def linear_add_plan(instr: Instruction, consts, in_dtype, b_dtype):
    """The compiled kernel (:class:`exec_native.NativeConv`, a 1x1 conv over the rows) of a
    LINEAR fused with an add, or None: multipliers not scalars or along the last axis, a
    bound of :func:`fused_add_epilogue` not met, a dtype the kernel does not take."""
    w, bias = consts[instr.consts[0]], consts[instr.consts[1]] if instr.consts[1] else None
    wt = consts.cached(("linear", instr.consts[0]), lambda: w.t().contiguous())  # k_linear's
    o = wt.shape[1]
    if not all(_last_axis(consts[c], o) for c in instr.consts[4:6]):
        return None
    bias = bias if bias is not None and bias.numel() else None
    a = acc_bound(wt, in_dtype, bias)
    epi, top = fused_add_epilogue(instr, consts, bias, a, o, b_dtype) or (None, 0)
    return exec_native.plan(wt, (1, 1), wt.shape[0], in_dtype, epi, bias, b_dtype, a, top)


def _last_axis(v: torch.Tensor, o: int) -> bool:
    """One value, or ``o`` values along the last axis (behind leading 1s)."""
    return v.numel() == 1 or (v.numel() == o and v.shape[-1] == o)


DIRECT_RUN_BYTES = 8
"""im2col rows made of runs shorter than this (``kw * C`` bytes: a 1-channel stem) gather
slowly; such convs run as one float32 convolution when that is exact."""


def direct_weight(wmat: torch.Tensor, kernel, in_dtype: torch.dtype) -> torch.Tensor | None:
    """float32 weights ``[O, C, kh, kw]`` (channels-last) for :func:`direct_acc`, or None.

    Used when the im2col runs are short (``kw * C * itemsize <`` :data:`DIRECT_RUN_BYTES`)
    and the float32 convolution is exact: every partial sum is an integer of magnitude at
    most ``acc_bound(wmat, in_dtype) < 2**24`` (exact float32 integers in any order), with
    oneDNN's direct algorithm and float32 math at full precision.
    """
    kh, kw = kernel
    c = wmat.shape[0] // (kh * kw)
    mkl = torch.backends.mkldnn
    full = getattr(getattr(mkl, "conv", None), "fp32_precision", "none") in ("none", "ieee")
    if kw * c * (torch.iinfo(in_dtype).bits // 8) >= DIRECT_RUN_BYTES or not full:
        return None
    if not mkl.is_available() or acc_bound(wmat, in_dtype, None) >= FLOAT32_EXACT:
        return None
    w = wmat.t().reshape(-1, kh, kw, c).permute(0, 3, 1, 2)
    return w.float().contiguous(memory_format=torch.channels_last)


def direct_acc(plan: ConvPlan, x: torch.Tensor) -> torch.Tensor:
    """The exact accumulator ``[N, OH, OW, O]`` (float32) of ``x [N, H, W, C]`` (real
    channels) as one oneDNN float32 convolution (:func:`direct_weight` proves exactness).

    FORMULA: ``acc[n, p, o] = sum_{i, j, c} x_pad[n, p*stride + (i, j)*dilation, c]
    * w[o, c, i, j]``; asymmetric pads are applied to the int8 input first.
    """
    strides, pads, dil = plan.geometry
    if pads[:2] != pads[2:]:
        x, pads = ek.pad_axes(x, (1, 2), pads, 0), [0, 0, 0, 0]
    xf = x.float().permute(0, 3, 1, 2)  # a channels-last NCHW view
    y = torch.mkldnn_convolution(xf, plan.w_f32, None, pads[:2], strides, dil, 1)
    return y.permute(0, 2, 3, 1)


def _first(v, o: int):
    """A per-channel constant cut to the first ``o`` channels (scalars stay scalars)."""
    return v if v is None or v.numel() <= 1 else v.reshape(-1)[:o]


def blocks(n: int, oh: int, ow: int, target: int):
    """``(n0, n1, h0, h1)`` output blocks of about ``target`` rows (``n*oh*ow`` in all)."""
    per_image = oh * ow
    if per_image <= target:
        step = max(target // per_image, 1)
        return [(i, min(i + step, n), 0, oh) for i in range(0, n, step)]
    band = max(target // ow, 1)
    return [(i, i + 1, h, min(h + band, oh)) for i in range(n) for h in range(0, oh, band)]


def im2col_view(xp: torch.Tensor, kernel, strides, dilations) -> torch.Tensor:
    """A view ``[N, OH, OW, ...]`` whose trailing axes flatten, in ``(i, j, c)`` order, to
    the im2col row of each output pixel: ``xp[n, p*stride + (i, j)*dilation, c]``.

    With unit dilation along W the ``kw * C`` values of one kernel row are contiguous in
    NHWC, so the view is ``[N, OH, OW, kh, kw*C]`` and the block copy moves runs of
    ``kw * C`` bytes (21 for a 3-channel 7x7 stem) instead of ``C``. When a pixel's bytes
    allow it the view is of a wider integer dtype (:func:`_wide`): same bytes, 8 per
    element for 16 int8 channels, so the copy moves 8x fewer elements; callers flatten a
    block to rows and view it back as the input dtype (:func:`im2col_rows`).
    """
    if dilations[1] != 1:
        cols = ek.windows(xp, (1, 2), kernel, strides, dilations)  # [N, OH, OW, C, kh, kw]
        return cols.permute(0, 1, 2, 4, 5, 3)
    xp = _wide(xp.contiguous())
    n, hp, wp, c = xp.shape
    (kh, kw), (sh, sw), dh = kernel, strides, dilations[0]
    oh, ow = ek.out_size(hp, kh, sh, 0, dh), ek.out_size(wp, kw, sw)
    if oh < 1 or ow < 1:
        raise SimulatorError(f"window {kernel} larger than padded input {(hp, wp)}")
    size, row = (n, oh, ow, kh, kw * c), wp * c
    return xp.as_strided(size, (hp * row, sh * row, sw * c, dh * row, 1))


def _wide(xp: torch.Tensor) -> torch.Tensor:
    """``xp [N, H, W, C]`` (contiguous) viewed as the widest of int64 / int32 / int16 whose
    size divides a pixel's ``C * itemsize`` bytes (itself when none is wider)."""
    xp = _row_major(xp)
    nbytes, offset = xp.shape[3] * xp.element_size(), xp.storage_offset() * xp.element_size()
    for dt in (torch.int64, torch.int32, torch.int16):
        size = torch.iinfo(dt).bits // 8
        if size <= xp.element_size():
            break
        if nbytes % size == 0 and offset % size == 0:
            return xp.view(dt)
    return xp


def _row_major(xp: torch.Tensor) -> torch.Tensor:
    """A contiguous ``xp`` with the row-major strides of its shape.

    torch calls a tensor contiguous whatever the strides of its size-1 axes (a
    ``[N, C, 1, 1]`` permuted to NHWC keeps stride 1 on H and W), yet a dtype view checks
    that every stride is a multiple of the widening; the same elements restrided pass.
    """
    strides, step = [], 1
    for size in reversed(xp.shape):
        strides.insert(0, step)
        step *= size
    return xp if xp.stride() == tuple(strides) else xp.as_strided(xp.shape, strides)


def im2col_rows(cols: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One block of an :func:`im2col_view` as the GEMM operand ``[rows, K]`` of ``dtype``
    (one copy; a widened view is viewed back as the input dtype)."""
    rows = cols.shape[0] * cols.shape[1] * cols.shape[2]
    return cols.reshape(rows, -1).view(dtype)


def run_conv(plan: ConvPlan, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """The conv (+ add) of ``plan`` on ``x [N, H, W, C_pad]`` (``b [N, OH, OW, O_pad]``).

    FORMULA: ``y[n, p, o] = epi(sum_{i, j, c} x_pad[n, p*stride + (i, j)*dilation, c]
    * wmat[(i, j, c), o], b[n, p, o])`` for the real ``c < C``, ``o < O``; 0 for ``o >= O``.
    """
    if plan.native is not None:
        return _run_native(plan, x, b)
    strides, pads, dil = plan.geometry
    x = x[..., : plan.channels] if plan.channels < x.shape[3] else x
    if plan.w_f32 is not None:
        cols = direct_acc(plan, x)  # the whole accumulator; blocks below only slice it
    else:
        cols = im2col_view(ek.pad_axes(x, (1, 2), pads, 0), plan.kernel, strides, dil)
    n, oh, ow = cols.shape[:3]
    o = plan.out_channels
    out = torch.empty((n, oh, ow, plan.out_padded), dtype=plan.epi.dtype)
    if o < plan.out_padded:
        out[..., o:] = 0
    target = max(BLOCK_ELEMS // max(o, 1), 1)
    for n0, n1, h0, h1 in blocks(n, oh, ow, target):
        if plan.w_f32 is not None:
            acc = cols[n0:n1, h0:h1].reshape(-1, o)
        else:
            acc = ek.gemm_int(im2col_rows(cols[n0:n1, h0:h1], x.dtype), plan.wmat)
        bb = None if b is None else b[n0:n1, h0:h1, :, :o].reshape(-1, o)
        plan.epi.apply(acc, bb, out=out[n0:n1, h0:h1, :, :o])
    return out


def _run_native(plan: ConvPlan, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """:func:`run_conv` through the compiled kernel (:mod:`simulator.kernels.exec_native`)."""
    n, h, w, _ = x.shape
    (kh, kw), (strides, pads, dil) = plan.kernel, plan.geometry
    oh = ek.out_size(h, kh, strides[0], pads[0] + pads[2], dil[0])
    ow = ek.out_size(w, kw, strides[1], pads[1] + pads[3], dil[1])
    if oh < 1 or ow < 1:
        raise SimulatorError(f"window {plan.kernel} larger than padded input {(h, w)}")
    out = native.empty((n, oh, ow, plan.out_padded), plan.native.out_dtype)  # pads zeroed
    if b is not None and (tuple(b.shape[:3]) != (n, oh, ow) or b.shape[3] < plan.out_channels):
        raise SimulatorError(f"add operand {tuple(b.shape)} for a conv output {(n, oh, ow)}")
    exec_native.run(plan.native, plan.geometry, x, b, out)
    return out
