"""The executor's int8 convolution through the compiled kernel (simulator/csrc/qconv.c).

:func:`plan` turns a proven :class:`~simulator.exec_conv.ConvPlan` into the kernel's
operands, once per program; :func:`run` calls it. The kernel computes the same integers as
the torch path of :func:`simulator.exec_conv.run_conv`:

FORMULA: ``acc[n, p, o] = sum_{i, j, c} x_pad[n, p*stride + (i, j)*dilation, c] * w[o, i, j, c]
+ bias[o]`` (exact int32), then ``y = clamp(round(acc * scale[o] + b * scale_b[o]), lo, hi)``
in float32 or float64, with the bounds of :mod:`simulator.exec_epilogue`:

- ``A = acc_bound(wmat, in_dtype, bias) < 2**31``: the int32 accumulator is exact (the
  kernel's sums wrap modulo 2**32 and land on the true value);
- ``T = A * max|scale numerator| (+ 128 * max|b numerator|) < exact_limit(mode, ftype)``:
  the product, the sum and the rounding are exact in ``ftype``; float32 when ``T`` is below
  the float32 limit (2**24 half_even, 2**23 bpu_round), else float64.

int8 or int16 inputs (int8 weights), int8 / int16 requantized outputs or an int32
output without requantize (``acc + bias``, relu; ``A < 2**31`` makes its saturation a
no-op) and an int8 add operand run here; the caller keeps the torch path for the rest, and
for everything when :func:`simulator.native.library` is None. QLinear runs as a 1x1
convolution over its rows (:func:`linear`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simulator import native
from simulator.exec_kernels import exact_limit

LANES = 16
"""Output channels per kernel block (one 512-bit register of int32)."""
IN_DTYPES = (torch.int8, torch.int16)
OUT_DTYPES = (torch.int8, torch.int16)
"""Requantized outputs; an int32 output without requantize also runs (``Epilogue.int_bias``)."""


@dataclass(frozen=True, eq=False)
class NativeConv:
    """One conv's operands in the kernel's layout (module docstring)."""

    weights: torch.Tensor  # int8 [kh, kw, Cs/4, Ob, 16, 4]
    corr: torch.Tensor  # int32 [Ob*16]: bias - 128 * sum_k w[k, o]
    scale: torch.Tensor | None  # float32/float64 [Ob*16]; None: int32 output, acc + bias
    scale_b: torch.Tensor | None  # same, for the fused add
    channels: int  # real input channels C
    cs: int  # C rounded up to 4 (int8 input) or 2 (int16)
    blocks: int  # Ob
    out_channels: int  # real O
    lo: int
    hi: int
    half_even: bool
    in_dtype: torch.dtype  # int8 or int16
    out_dtype: torch.dtype  # int8, int16 or int32


def _lanes(v: torch.Tensor, o: int, blocks: int, dtype: torch.dtype) -> torch.Tensor:
    """A scalar or per-channel constant as ``[blocks * 16]`` of ``dtype`` (0 past ``o``)."""
    out = torch.zeros(blocks * LANES, dtype=dtype)
    out[:o] = v.reshape(-1).to(dtype).expand(o) if v.numel() == 1 else v.reshape(-1).to(dtype)
    return out


def pack_weights(wmat: torch.Tensor, kernel, channels: int, group: int = 4):
    """``wmat [kh*kw*C, O]`` (rows in ``(i, j, c)`` order) as ``[kh, kw, Cs/g, Ob, 16, g]``
    with zeros for ``c >= C`` and ``o >= O``: int8 for ``group`` 4 (int8 inputs), int16 for
    2 (int16 inputs); returns ``(packed, Cs, Ob)``, ``Cs`` = C rounded up to ``group``."""
    (kh, kw), o = kernel, wmat.shape[1]
    cs, blocks = -(-channels // group) * group, -(-o // LANES)
    dtype = torch.int8 if group == 4 else torch.int16
    w = torch.zeros(kh, kw, cs, blocks * LANES, dtype=dtype)
    w[:, :, :channels, :o] = wmat.reshape(kh, kw, channels, o)
    w = w.reshape(kh, kw, cs // group, group, blocks, LANES).permute(0, 1, 2, 4, 5, 3)
    return w.contiguous(), cs, blocks


def plan(wmat, kernel, channels: int, in_dtype, epi, bias, b_dtype, bound: int, top: int):
    """The :class:`NativeConv` of ``wmat [kh*kw*C, O]`` (rows in ``(i, j, c)`` order) on
    ``in_dtype`` inputs with its :class:`~simulator.exec_epilogue.Epilogue`, or None when
    the kernel does not apply: no compiled library, dtypes not handled, bounds not met.

    ``bound`` is ``A``, ``top`` is ``T`` of the module docstring."""
    if native.library() is None or epi is None or wmat.dtype != torch.int8 or bound >= 2**31:
        return None
    if in_dtype not in IN_DTYPES or b_dtype not in (None, torch.int8):
        return None
    o, has_bias = wmat.shape[1], bias is not None and bias.numel() > 0
    b = bias.reshape(-1).long() if has_bias else torch.zeros(o, dtype=torch.long)
    scale = scale_b = None
    if epi.int_bias is None:  # requantize: float32 or float64 as proven exact
        if epi.scale is None or epi.dtype not in OUT_DTYPES or top >= exact_limit(epi.rounding):
            return None
        if epi.rounding not in ("half_even", "bpu_round"):
            return None
        f32 = top < exact_limit(epi.rounding, torch.float32)
        ftype = torch.float32 if f32 else torch.float64
        scale, scale_b = (None if v is None else _lanes(v, o, -(-o // LANES), ftype)
                          for v in (epi.scale, epi.scale_b))  # fmt: skip
    group = 4 if in_dtype == torch.int8 else 2
    weights, cs, blocks = pack_weights(wmat, kernel, channels, group)
    offset = 128 * wmat.long().sum(0) if in_dtype == torch.int8 else 0  # the uint8 offset
    corr = _lanes(b - offset, o, blocks, torch.int32)
    return NativeConv(weights, corr, scale, scale_b, channels, cs, blocks, o, epi.lo, epi.hi,
                      epi.rounding == "half_even", in_dtype, epi.dtype)  # fmt: skip


def run(nc: NativeConv, geometry, kernel, x: torch.Tensor, b, out: torch.Tensor) -> None:
    """``out[..., :O] = conv(x) (+ b)`` for ``x [N, H, W, C_stored]`` int8 into
    ``out [N, OH, OW, O_pad]`` (contiguous, ``nc.out_dtype``); ``b [N, OH, OW, B_pad]`` int8
    or None."""
    lib = native.library()
    strides, pads, dil = geometry
    x = x.contiguous()
    n, h, w, cx = x.shape
    hp, wp = h + pads[0] + pads[2], w + pads[1] + pads[3]
    wide = nc.in_dtype == torch.int16
    xs = torch.empty((n, hp, wp, nc.cs), dtype=torch.int16 if wide else torch.uint8)
    pad = lib.qp_pad_i16 if wide else lib.qp_pad_u8
    pad(native.ptr(x), n, h, w, cx, nc.channels, pads[0], pads[2], pads[1], pads[3], nc.cs,
        native.ptr(xs))  # fmt: skip
    b = None if b is None else b.contiguous()
    oh, ow = out.shape[1:3]
    f64 = nc.scale is not None and nc.scale.dtype == torch.float64
    lib.qp_conv(native.ptr(xs), int(wide), n, hp, wp, nc.cs, native.ptr(nc.weights), *kernel,
                nc.blocks, nc.out_channels, *strides, *dil, oh, ow, native.ptr(nc.corr),
                native.ptr(nc.scale), native.ptr(nc.scale_b), int(f64), native.ptr(b),
                0 if b is None else b.shape[3], nc.lo, nc.hi, int(nc.half_even),
                native.ptr(out), out.element_size().bit_length() - 1, out.shape[3])  # fmt: skip


def linear(nc: NativeConv, x: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ wmat`` with the epilogue: ``[..., O]`` (a 1x1 conv over the rows)."""
    k, o = x.shape[-1], nc.out_channels
    out = torch.empty((*x.shape[:-1], o), dtype=nc.out_dtype)
    rows = x.reshape(-1, 1, 1, k)
    run(nc, ([1, 1], [0, 0, 0, 0], [1, 1]), (1, 1), rows, None, out.view(-1, 1, 1, o))
    return out
