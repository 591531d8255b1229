"""The fast NHWC convolution of the executor: real input channels, blocked im2col + int8 GEMM
+ fused float64 epilogue, and the fused conv + add instruction.

A CONV instruction in the nhwc layout with ``group == 1`` and an int8 input runs here
when its float64 epilogue is proven exact (:mod:`simulator.exec_epilogue`); everything
else keeps :func:`simulator.exec_ops.k_conv`. Per instruction a :class:`ConvPlan` is built
once per program and input dtype:

- Input channels: the input buffer's :class:`~simulator.isa.Layout` says how many of its
  ``C_pad`` channels are real; the GEMM uses only those (``K = kh * kw * C`` instead of
  ``kh * kw * C_pad``: 147 instead of 784 for a 3-channel 7x7 stem). Padding channels hold
  0, so dropping them from both operands changes no sum. Output channels beyond the real
  ``O`` (multiplier 0 in the packing, so always 0) are written as 0 without computing.
- Blocks: output rows are processed in blocks of about :data:`BLOCK_ELEMS` accumulators
  (whole images, or bands of output rows of one image), so the im2col copy, the int32
  accumulator and the float64 epilogue of a block stay in cache.
- Fused conv + add (``len(inputs) == 2``; consts ``w, bias, mult, shift, ma, mb,
  add_shift``): FORMULA ``acc = clamp(conv_int(x, w) + bias, int32)`` (the conv's int32
  output: ``mult``/``shift`` empty), then QAdd ``y = clamp(round_div(acc*ma + b*mb,
  2**add_shift))``, relu, cast -- exactly :func:`simulator.int_ops.qconv` into
  :func:`simulator.int_ops.qadd`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schemas.errors import SimulatorError
from simulator import exec_kernels as ek
from simulator.exec_epilogue import (
    FLOAT_EXACT,
    INT32,
    Epilogue,
    acc_bound,
    dtype_bound,
    epilogue,
    gemm_epilogue,
)
from simulator.isa import Instruction

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


def _real(n: int, layout) -> int:
    """Real channel count of a buffer with ``n`` stored channels (its layout may say)."""
    return layout.channels if layout is not None and 0 < layout.channels <= n else n


def build_plan(instr: Instruction, consts, in_dtype: torch.dtype, b_dtype) -> ConvPlan | None:
    """The :class:`ConvPlan` of an nhwc group-1 conv, or None when the float64 epilogue
    cannot be proven exact (then the int64 path runs).

    FORMULA of the bounds: conv ``A = acc_bound(wmat, in_dtype, bias)``; plain conv needs
    ``A * max|mult| < 2**53``; fused add needs ``A < 2**31`` (the int32 clamp is then a
    no-op) and ``A * max|ma| + max|b| * max|mb| < 2**53``.
    """
    w, bias, mult, shift = (consts[c] if c else None for c in instr.consts[:4])
    c = _real(w.shape[3], consts.layouts.get(instr.inputs[0]))
    o = _real(w.shape[0], consts.layouts.get(instr.outputs[0]))
    wmat = w[:o, :, :, :c].reshape(o, -1).t().contiguous()
    bias = bias[:o] if bias is not None and bias.numel() else None
    a, mult, shift = acc_bound(wmat, in_dtype, bias), _first(mult, o), _first(shift, o)
    if b_dtype is None:
        epi = gemm_epilogue(instr.attrs, wmat, in_dtype, bias, mult, shift)
    else:
        if (mult is not None and mult.numel()) or (shift is not None and shift.numel()):
            return None  # the conv itself requantizes: not the fused form
        ma, mb, add_shift = (_first(consts[n], o) for n in instr.consts[4:7])
        epi = epilogue(instr.attrs, bias, ma, add_shift, mb)
        top = a * int(ma.abs().max()) + dtype_bound(b_dtype) * int(mb.abs().max())
        epi = epi if a <= INT32[1] and top < FLOAT_EXACT else None
    if epi is None:
        return None
    geometry = ek.geometry(2, instr.attrs)
    return ConvPlan(wmat, c, o, w.shape[0], tuple(w.shape[1:3]), geometry, epi)


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
    ``kw * C`` bytes (21 for a 3-channel 7x7 stem) instead of ``C``.
    """
    if dilations[1] != 1:
        cols = ek.windows(xp, (1, 2), kernel, strides, dilations)  # [N, OH, OW, C, kh, kw]
        return cols.permute(0, 1, 2, 4, 5, 3)
    xp = xp.contiguous()
    n, hp, wp, c = xp.shape
    (kh, kw), (sh, sw), dh = kernel, strides, dilations[0]
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - kw) // sw + 1
    if oh < 1 or ow < 1:
        raise SimulatorError(f"window {kernel} larger than padded input {(hp, wp)}")
    size, row = (n, oh, ow, kh, kw * c), wp * c
    return xp.as_strided(size, (hp * row, sh * row, sw * c, dh * row, 1))


def run_conv(plan: ConvPlan, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """The conv (+ add) of ``plan`` on ``x [N, H, W, C_pad]`` (``b [N, OH, OW, O_pad]``).

    FORMULA: ``y[n, p, o] = epi(sum_{i, j, c} x_pad[n, p*stride + (i, j)*dilation, c]
    * wmat[(i, j, c), o], b[n, p, o])`` for the real ``c < C``, ``o < O``; 0 for ``o >= O``.
    """
    strides, pads, dil = plan.geometry
    x = x[..., : plan.channels] if plan.channels < x.shape[3] else x
    cols = im2col_view(ek.pad_axes(x, (1, 2), pads, 0), plan.kernel, strides, dil)
    n, oh, ow = cols.shape[:3]
    o, k = plan.out_channels, plan.wmat.shape[0]
    out = torch.empty((n, oh, ow, plan.out_padded), dtype=plan.epi.dtype)
    if o < plan.out_padded:
        out[..., o:] = 0
    target = max(BLOCK_ELEMS // max(o, 1), 1)
    for n0, n1, h0, h1 in blocks(n, oh, ow, target):
        acc = ek.gemm_int(cols[n0:n1, h0:h1].reshape(-1, k), plan.wmat)
        bb = None if b is None else b[n0:n1, h0:h1, :, :o].reshape(-1, o)
        plan.epi.apply(acc, bb, out=out[n0:n1, h0:h1, :, :o])
    return out
