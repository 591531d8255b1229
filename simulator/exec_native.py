"""The executor's int8 convolution through the compiled kernel (simulator/csrc/qconv.c).

:func:`plan` turns a proven :class:`~simulator.exec_conv.ConvPlan` into the kernel's
operands, once per program; :func:`run` calls it. The kernel computes the same integers as
the torch path of :func:`simulator.exec_conv.run_conv`:

FORMULA: ``acc[n, p, o] = sum_{i, j, c} x_pad[n, p*stride + (i, j)*dilation, c] * w[o, i, j, c]
+ bias[o]`` (exact int32), then ``y = clamp(round(acc * scale[o] + b * scale_b[o]), lo, hi)``
in float32 or float64, with the bounds of :mod:`simulator.exec_epilogue`:

- ``A = acc_bound(wmat, int8, bias) < 2**31``: the int32 accumulator is exact (the
  kernel's unsigned-offset sums wrap modulo 2**32 and land on the true value);
- ``T = A * max|scale numerator| (+ 128 * max|b numerator|) < exact_limit(mode, ftype)``:
  the product, the sum and the rounding are exact in ``ftype``; float32 when ``T`` is below
  the float32 limit (2**24 half_even, 2**23 bpu_round), else float64.

Only int8 input, int8 output and an int8 add operand run here; the caller keeps the torch
path for the rest, and for everything when :func:`simulator.native.library` is None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simulator import native
from simulator.exec_kernels import exact_limit

LANES = 16
"""Output channels per kernel block (one 512-bit register of int32)."""


@dataclass(frozen=True, eq=False)
class NativeConv:
    """One conv's operands in the kernel's layout (module docstring)."""

    weights: torch.Tensor  # int8 [kh, kw, Cs/4, Ob, 16, 4]
    corr: torch.Tensor  # int32 [Ob*16]: bias - 128 * sum_k w[k, o]
    scale: torch.Tensor  # float32/float64 [Ob*16]
    scale_b: torch.Tensor | None  # same, for the fused add
    channels: int  # real input channels C
    cs: int  # C rounded up to 4
    blocks: int  # Ob
    out_channels: int  # real O
    lo: int
    hi: int
    half_even: bool


def _lanes(v: torch.Tensor, o: int, blocks: int, dtype: torch.dtype) -> torch.Tensor:
    """A scalar or per-channel constant as ``[blocks * 16]`` of ``dtype`` (0 past ``o``)."""
    out = torch.zeros(blocks * LANES, dtype=dtype)
    out[:o] = v.reshape(-1).to(dtype).expand(o) if v.numel() == 1 else v.reshape(-1).to(dtype)
    return out


def pack_weights(wmat: torch.Tensor, kernel, channels: int) -> tuple[torch.Tensor, int, int]:
    """``wmat [kh*kw*C, O]`` (rows in ``(i, j, c)`` order) as ``[kh, kw, Cs/4, Ob, 16, 4]``
    int8 with zeros for ``c >= C`` and ``o >= O``; returns ``(packed, Cs, Ob)``."""
    (kh, kw), o = kernel, wmat.shape[1]
    cs, blocks = -(-channels // 4) * 4, -(-o // LANES)
    w = torch.zeros(kh, kw, cs, blocks * LANES, dtype=torch.int8)
    w[:, :, :channels, :o] = wmat.reshape(kh, kw, channels, o)
    w = w.reshape(kh, kw, cs // 4, 4, blocks, LANES).permute(0, 1, 2, 4, 5, 3)
    return w.contiguous(), cs, blocks


def plan(conv, bias, b_dtype, bound: int, top: int) -> NativeConv | None:
    """The :class:`NativeConv` of ``conv`` (an exec_conv.ConvPlan), or None when the kernel
    does not apply: no compiled library, not int8 in/out, or bounds not met.

    ``bound`` is ``A``, ``top`` is ``T`` of the module docstring."""
    epi = conv.epi
    if native.library() is None or epi.scale is None or epi.int_bias is not None:
        return None
    if conv.wmat.dtype != torch.int8 or epi.dtype != torch.int8 or bound >= 2**31:
        return None
    if b_dtype not in (None, torch.int8) or epi.rounding not in ("half_even", "bpu_round"):
        return None
    mode = epi.rounding
    if top >= exact_limit(mode):
        return None
    ftype = torch.float32 if top < exact_limit(mode, torch.float32) else torch.float64
    weights, cs, blocks = pack_weights(conv.wmat, conv.kernel, conv.channels)
    o = conv.out_channels
    col = conv.wmat.long().sum(0)
    b = torch.zeros(o, dtype=torch.long) if bias is None else bias.reshape(-1).long()
    corr = _lanes(b - 128 * col, o, blocks, torch.int32)
    scale_b = None if epi.scale_b is None else _lanes(epi.scale_b, o, blocks, ftype)
    return NativeConv(weights, corr, _lanes(epi.scale, o, blocks, ftype), scale_b,
                      conv.channels, cs, blocks, o, epi.lo, epi.hi, mode == "half_even")  # fmt: skip


def run(nc: NativeConv, geometry, kernel, x: torch.Tensor, b, out: torch.Tensor) -> None:
    """``out[..., :O] = conv(x) (+ b)`` for ``x [N, H, W, C_stored]`` int8 into
    ``out [N, OH, OW, O_pad]`` (contiguous int8); ``b [N, OH, OW, B_pad]`` int8 or None."""
    lib = native.library()
    strides, pads, dil = geometry
    x = x.contiguous()
    n, h, w, cx = x.shape
    hp, wp = h + pads[0] + pads[2], w + pads[1] + pads[3]
    xu = torch.empty((n, hp, wp, nc.cs), dtype=torch.uint8)
    lib.qp_pad_u8(native.ptr(x), n, h, w, cx, nc.channels, pads[0], pads[2], pads[1], pads[3],
                  nc.cs, native.ptr(xu))  # fmt: skip
    b = None if b is None else b.contiguous()
    oh, ow = out.shape[1:3]
    lib.qp_conv_s8(native.ptr(xu), n, hp, wp, nc.cs, native.ptr(nc.weights), *kernel,
                   nc.blocks, nc.out_channels, *strides, *dil, oh, ow, native.ptr(nc.corr),
                   native.ptr(nc.scale), native.ptr(nc.scale_b),
                   int(nc.scale.dtype == torch.float64), native.ptr(b),
                   0 if b is None else b.shape[3], nc.lo, nc.hi, int(nc.half_even),
                   native.ptr(out), out.shape[3])  # fmt: skip
