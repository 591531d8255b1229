"""The executor's integer convolution and QLinear through the compiled kernel
(simulator/csrc/qconv.c).

:func:`plan` turns a conv's GEMM-form weights and proven epilogue (what
:func:`simulator.kernels.exec_conv.build_plan` and :func:`simulator.kernels.exec_ops.k_linear` build) into
the kernel's operands, once per program; :func:`run` calls it. The kernel computes the same
integers as the torch path of :func:`simulator.kernels.exec_conv.run_conv`:

FORMULA: ``acc[n, p, o] = sum_{i, j, c} x_pad[n, p*stride + (i, j)*dilation, c] * w[o, i, j, c]
+ bias[o]`` (exact int32), then ``y = clamp(round(acc * scale[o] + b * scale_b[o]), lo, hi)``
in float32 or float64, with the bounds of :mod:`simulator.kernels.exec_epilogue`:

- ``A = acc_bound(wmat, in_dtype, bias) < 2**31``: the int32 accumulator is exact (the
  kernel's sums wrap modulo 2**32 and land on the true value);
- ``T = A * max|scale numerator| (+ max|b| * max|b numerator|) < exact_limit(mode, ftype)``:
  the product, the sum and the rounding are exact in ``ftype``; float32 when ``T`` is below
  the float32 limit (2**24 half_even, 2**23 bpu_round) or :func:`magic32` holds (then one
  FMA rounds the exact product: ``A < 2**24``, ``A * max|scale| < 2**22``), else float64.

int8 or int16 inputs (int8 weights), int8 / int16 requantized outputs or an int32
output without requantize (``acc + bias``, relu; ``A < 2**31`` makes its saturation a
no-op) and an int8 / int16 / int32 add operand run here; the caller keeps the torch path for the rest, and
for everything when :func:`simulator.runtime.native.library` is None. QLinear runs as a 1x1
convolution over its rows (:func:`linear`), on AMX-INT8 tiles where the CPU and the OS
allow them (csrc/qamx.c: the same products, sums and epilogue; :func:`_amx`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simulator.arith import fixedpoint as fp
from simulator.kernels.exec_kernels import exact_limit
from simulator.runtime import native
from simulator.runtime.memo import derived

LANES = 16
"""Output channels per kernel block (one 512-bit register of int32)."""
IN_DTYPES = (torch.int8, torch.int16)
INT_DTYPES = (torch.int8, torch.int16, torch.int32)
"""The fused add's operand (int32: a downsample branch's accumulator), the row kernels'
operands and outputs; :func:`simulator.runtime.native.code` is their dtype code."""
OUT_DTYPES = (torch.int8, torch.int16)
"""Requantized outputs; an int32 output without requantize also runs (``Epilogue.int_bias``)."""


@dataclass(frozen=True, eq=False)
class NativeConv:
    """One conv's operands in the kernel's layout (module docstring)."""

    weights: torch.Tensor  # int8 [kh, kw, Cs/4, Ob, 16, 4]
    corr: torch.Tensor  # int32 [Ob*16]: bias - 128 * sum_k w[k, o]
    bias: torch.Tensor  # int32 [Ob*16]: corr + 128 * sum_k w[k, o], where the AVX2 build's
    # non-negative form (qconv_avx2.h window4, x itself) starts its sums
    scale: torch.Tensor | None  # float32/float64 [Ob*16]; None: int32 output, acc + bias
    scale_b: torch.Tensor | None  # same, for the fused add
    channels: int  # real input channels C
    cs: int  # values per input pixel: C rounded up to 4 (int8) or 2 (int16); C for row runs
    blocks: int  # Ob
    out_channels: int  # real O
    lo: int
    hi: int
    half_even: bool
    in_dtype: torch.dtype  # int8 or int16
    out_dtype: torch.dtype  # int8, int16 or int32
    groups: int  # 4-byte groups per kernel tap
    taps: tuple[int, int]  # the kernel as the kernel runs it: (kh, 1) for row runs
    row_runs: bool
    mode: int = 0  # the epilogue's code (scale_lanes): 0 float32, 1 float64, 2/3 magic 64/32


MAGIC_LIMIT = 2**30
"""``|acc * scale + b * scale_b|`` below which qepi.h rounds a float64 half_even epilogue
by adding ``1.5 * 2**52`` and reads the integer from the low 32 bits (its mode 2)."""

MAGIC32_LIMITS = (2**24, 2**22)
"""Mode 3 (float32, rounded by adding ``1.5 * 2**23`` in the product's FMA) needs the
accumulator bound below the first (every int32 accumulator is then a float32) and
``bound * max|scale|`` below the second (the sum stays in ``[2**22, 2**23) + 2**23``, whose
float32 spacing is 1)."""


def epi_mode(scale, scale_b, bound: int, b_dtype, half_even: bool) -> int:
    """qepi.h's ``f64`` code for float64 ``scale`` lanes: 1, or 2 (rounded by the 1.5 *
    2**52 addition) when half_even and ``bound * max|scale| + max|b| * max|scale_b|``
    (``bound``: the accumulator's, ``max|b|`` from ``b_dtype``) is below
    :data:`MAGIC_LIMIT`: then every value and its rounding stay within int32. Float32
    lanes take 0 or 3 (:func:`scale_lanes`)."""
    top = bound * float(scale.abs().max())
    if scale_b is not None:
        top += 2 ** (torch.iinfo(b_dtype).bits - 1) * float(scale_b.abs().max())
    return 2 if half_even and top < MAGIC_LIMIT else 1


def magic32(scale, scale_b, bound: int, half_even: bool) -> bool:
    """Whether qepi.h's mode 3 rounds ``acc * scale`` exactly: ``round_half_even(acc *
    scale) = fma(float32(acc), float32(scale), 1.5 * 2**23) - 1.5 * 2**23``.

    FORMULA: exact when half_even, no fused add, ``bound < 2**24`` (``float32(acc) = acc``),
    every ``scale`` a float32 (``m * 2**-s`` with ``m`` of at most 24 significant bits) and
    ``bound * max|scale| < 2**22``: the FMA rounds the exact ``acc * scale + 1.5 * 2**23``
    once, to nearest even, in ``[2**23, 2**24)`` where float32 holds every integer and no
    fraction; the sum's parity is the rounded product's, 1.5 * 2**23 being even. The
    float's bits are then ``0x4B400000 +`` the integer (qepi.h's magic_ps16)."""
    if not half_even or scale_b is not None or scale is None or bound >= MAGIC32_LIMITS[0]:
        return False
    s = scale.double()
    exact = bool(torch.equal(s.float().double(), s))
    return exact and bound * float(s.abs().max()) < MAGIC32_LIMITS[1]


def scale_lanes(epi, o: int, bound: int, top: int, b_dtype=None, block: int = LANES):
    """``(scale, scale_b, mode)`` of a requantizing epilogue: its lanes (:func:`lanes`) and
    qepi.h's code for them: 3 (float32) when :func:`magic32` holds, 0 (float32) when ``top``
    (``T``) is below the float32 limit, else float64 with :func:`epi_mode`'s code."""
    half_even = epi.rounding == "half_even"
    magic = magic32(epi.scale, epi.scale_b, bound, half_even)
    f32 = magic or top < exact_limit(epi.rounding, torch.float32)
    ftype = torch.float32 if f32 else torch.float64
    scale, scale_b = (None if v is None else lanes(v, o, ftype, block) for v in (epi.scale, epi.scale_b))
    mode = 3 if magic else 0 if f32 else epi_mode(scale, scale_b, bound, b_dtype, half_even)
    return scale, scale_b, mode


def lanes(v: torch.Tensor, o: int, dtype: torch.dtype, block: int = LANES) -> torch.Tensor:
    """A scalar or per-channel constant as ``[Ob * block]`` of ``dtype`` (0 past ``o``)."""
    out = torch.zeros(-(-o // block) * block, dtype=dtype)
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


def plan(wmat, kernel, channels: int, in_dtype, epi, bias, b_dtype, bound: int, top: int,
         unit_w_dilation: bool = True):  # fmt: skip
    """The :class:`NativeConv` of ``wmat [kh*kw*C, O]`` (rows in ``(i, j, c)`` order) on
    ``in_dtype`` inputs with its :class:`~simulator.kernels.exec_epilogue.Epilogue`, or None when
    the kernel does not apply: no compiled library, dtypes not handled, bounds not met.

    ``bound`` is ``A``, ``top`` is ``T`` of the module docstring. With ``unit_w_dilation``
    and a pixel that is not a whole number of 4-byte groups, the kernel rows run as row
    runs (:func:`_layout`)."""
    if native.library() is None or epi is None or wmat.dtype != torch.int8 or bound >= 2**31:
        return None
    if in_dtype not in IN_DTYPES or b_dtype not in (None, *INT_DTYPES):
        return None
    o, has_bias = wmat.shape[1], bias is not None and bias.numel() > 0
    b = bias.reshape(-1).long() if has_bias else torch.zeros(o, dtype=torch.long)
    scale, scale_b, mode = None, None, 0
    if epi.int_bias is None:  # requantize: float32 or float64 as proven exact
        if epi.scale is None or epi.dtype not in OUT_DTYPES or top >= exact_limit(epi.rounding):
            return None
        if epi.rounding not in fp.ROUNDING_MODES:
            return None
        scale, scale_b, mode = scale_lanes(epi, o, bound, top, b_dtype)
    weights, cs, blocks, groups, taps = _layout(wmat, kernel, channels, in_dtype, unit_w_dilation)
    offset = 128 * wmat.long().sum(0) if in_dtype == torch.int8 else 0  # the uint8 offset
    corr, bias_lanes = lanes(b - offset, o, torch.int32), lanes(b, o, torch.int32)
    half_even = epi.rounding == "half_even"
    return NativeConv(weights, corr, bias_lanes, scale, scale_b, channels, cs, blocks, o, epi.lo, epi.hi,
                      half_even, in_dtype, epi.dtype, groups, taps, taps != tuple(kernel), mode)


def _layout(wmat, kernel, channels: int, in_dtype, unit_w_dilation: bool):
    """``(packed weights, input channels per pixel, Ob, 4-byte groups per tap, taps)``.

    A pixel of ``C`` values ``C * itemsize`` bytes long that is not a multiple of 4 (one
    int8 channel, three RGB channels) wastes most of each 4-byte group; with unit W
    dilation a kernel row's ``kw * C`` values are contiguous in the input instead, so they
    are packed as one tap of a ``(kh, 1)`` kernel over pixels of exactly ``C`` values
    (``wmat``'s ``(i, j, c)`` row order is already that run's order)."""
    group = 4 if in_dtype == torch.int8 else 2  # values per 4-byte group
    (kh, kw) = kernel
    if unit_w_dilation and kw > 1 and channels % group:
        weights, run, blocks = pack_weights(wmat, (kh, 1), kw * channels, group)
        return weights, channels, blocks, run // group, (kh, 1)
    weights, cs, blocks = pack_weights(wmat, kernel, channels, group)
    return weights, cs, blocks, cs // group, (kh, kw)


def run(nc: NativeConv, geometry, x: torch.Tensor, b, out: torch.Tensor) -> None:
    """``out[..., :O] = conv(x) (+ b)`` and ``out[..., O:] = 0`` for ``x [N, H, W, C_stored]``
    into ``out [N, OH, OW, O_pad]`` (contiguous, ``nc.out_dtype``); ``b [N, OH, OW, B_pad]``
    (:data:`INT_DTYPES`) or None. On AMX-INT8 tiles (csrc/qamxconv.c) when :func:`amx_kp`
    takes the conv, else by qp_conv."""
    strides, pads, dil = geometry
    xs, mode = _padded(nc, x.contiguous(), pads)
    b = None if b is None else b.contiguous()
    n, hp, wp = xs.shape[:3]
    lib, ptr = native.library(), native.ptr
    head = (ptr(xs), mode, n, hp, wp, nc.cs, nc.groups)
    shape = (*nc.taps, nc.blocks, nc.out_channels, *strides, dil[0],
             1 if nc.row_runs else dil[1], *out.shape[1:3])  # fmt: skip
    tail = (ptr(nc.scale), ptr(nc.scale_b), nc.mode, ptr(b), 0 if b is None else b.shape[3],
            0 if b is None else native.code(b), nc.lo, nc.hi, int(nc.half_even), ptr(out),
            native.code(out), out.shape[3])  # fmt: skip
    kp = amx_kp(nc, strides, pads)
    corr = (ptr(nc.corr), ptr(nc.bias))
    if kp and lib.qp_conv_amx(*head, ptr(amx_weights(nc, kp)), *shape, *corr, *tail, kp) == 0:
        return
    lib.qp_conv(*head, ptr(nc.weights), *shape, *corr, *tail)


AMX_CONV_MIN = (64, 4)
"""Bytes per kernel tap and output channel blocks from which a conv whose windows
qamxconv.c gathers runs on AMX tiles (an unpadded stride-1 1x1 conv, loaded as it lies,
always does). The gather copies every window (qp_conv reads it in place), one move per run
of taps back to back in the input, and a copied byte meets as many products as there are
output channels. ``bench/conv_paths.py`` on an AMX host (2026-12-04, bench/README.md), with
the taps copied in runs: digits' 16 -> 16 3x3 (16-byte taps, one block) 0.92x on the
tiles, 32 -> 32 0.99x, the RGB stems 0.75-0.91x (tap by tap they were 0.48x, 0.75x and
0.65-0.85x); ResNet's stride-2 3x3 convs (64-byte taps and up) 1.53-1.72x gathered, its
stride-1 3x3 convs 2.0-2.4x off the padded grid (whole-chunk taps: no gather)."""


def amx_kp(nc: NativeConv, strides, pads) -> int | None:
    """The padded window length (K = taps x 4-byte groups x 4, rounded up to 64) with which
    qamxconv.c runs this conv at ``strides`` and ``pads``, or None: no AMX here
    (:func:`simulator.runtime.native.amx`), int16 inputs (VPDPWSSD in qp_conv), or taps and
    channels below :data:`AMX_CONV_MIN` unless the conv is an unpadded stride-1 1x1 one,
    whose pixels qamxconv.c loads into its tiles as they lie, without a gather (1.05-2.3x
    qp_conv on every such conv ``bench/conv_paths.py`` times)."""
    if nc.in_dtype != torch.int8 or not native.amx():
        return None
    flat = nc.taps == (1, 1) and tuple(strides) == (1, 1) and not any(pads)
    if not flat and (nc.groups * 4 < AMX_CONV_MIN[0] or nc.blocks < AMX_CONV_MIN[1]):
        return None
    return -(-nc.taps[0] * nc.taps[1] * nc.groups * 4 // 64) * 64


def _padded(nc: NativeConv, x: torch.Tensor, pads) -> tuple[torch.Tensor, int]:
    """The kernel's input and its mode (qconv.c ``wide``): ``x`` padded, ``nc.cs`` values per
    pixel, int8 as ``x ^ qp_pad_offset()`` (0x80: uint8-offset; 0 in the AVX2 build, which
    offsets as it reads), followed by 4 bytes of slack for the last row run's over-read
    (mode 0; int16: 1); an input with nothing to pad is used in place (int16: 1; int8: 2,
    offset by the kernel as it reads)."""
    n, h, w, cx = x.shape
    wide = nc.in_dtype == torch.int16
    if not any(pads) and cx == nc.cs and not nc.row_runs:
        return x, 1 if wide else 2
    hp, wp = h + pads[0] + pads[2], w + pads[1] + pads[3]
    size = n * hp * wp * nc.cs
    xs = native.empty(size + 4, dtype=torch.int16 if wide else torch.uint8)[:size]
    xs = xs.view(n, hp, wp, nc.cs)
    native.library().qp_pad(native.ptr(x), int(wide), n, h, w, cx, nc.channels, pads[0],
                            pads[2], pads[1], pads[3], nc.cs, native.ptr(xs))  # fmt: skip
    return xs, int(wide)


def linear(nc: NativeConv, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ wmat`` with the epilogue (and a fused add's ``b [..., O]``):
    ``[..., O]`` (a 1x1 conv over the rows; on AMX tiles when :func:`_amx` takes it)."""
    k, o = x.shape[-1], nc.out_channels
    out = native.empty((*x.shape[:-1], o), dtype=nc.out_dtype)
    if _amx(nc, x, b, out):
        return out
    rows = x.reshape(1, 1, -1, k)  # one image row: one contiguous copy in the kernel's pad
    b = None if b is None else b.reshape(1, 1, -1, o)
    run(nc, ([1, 1], [0, 0, 0, 0], [1, 1]), rows, b, out.view(1, 1, -1, o))
    return out


AMX_K_MAX = 512
"""Longest row (K rounded up to 64) qamx.c's per-thread tile buffers take."""


def _amx(nc: NativeConv, x: torch.Tensor, b, out: torch.Tensor) -> bool:
    """Run :func:`linear` by qamx.c's AMX-INT8 kernel (same products, same epilogue), or
    return False: no AMX here (:func:`simulator.runtime.native.amx`), or rows longer than
    :data:`AMX_K_MAX`."""
    k, kp = x.shape[-1], -(-x.shape[-1] // 64) * 64
    if not native.amx() or kp > AMX_K_MAX or k != nc.channels or not x.numel():
        return False
    x = x.contiguous()
    b = None if b is None else b.contiguous()
    w = amx_weights(nc, kp)
    rc = native.library().qp_linear_amx(
        native.ptr(x), native.code(x), x.numel() // k, k, kp, native.ptr(w), nc.blocks,
        nc.out_channels, native.ptr(nc.corr), native.ptr(nc.scale), native.ptr(nc.scale_b),
        nc.mode, native.ptr(b), 0 if b is None else native.code(b), nc.lo, nc.hi,
        int(nc.half_even), native.ptr(out), native.code(out))  # fmt: skip
    return rc == 0


def amx_weights(nc: NativeConv, kp: int) -> torch.Tensor:
    """The weights as qamx.c and qamxconv.c read them (qamx.h's ``weight_tile``), once per
    conv: ``[ceil(Ob/2), kp/64, 2, 16, 16, 4]`` int8, tile ``(c, j)`` = K groups ``16c ..
    16c+15`` (4 bytes of K each) of channel block ``j``, zero past K and past Ob (from the
    packed ``[1, 1, Cs/g, Ob, 16, g]`` of either input dtype). A pair of channel blocks'
    tiles over K lie in one run, read as one stream."""

    def build() -> torch.Tensor:
        g, pairs = nc.weights.shape[-1], -(-nc.blocks // 2)
        w = (
            nc.weights.reshape(-1, nc.blocks * LANES, g)
            .permute(0, 2, 1)
            .reshape(-1, nc.blocks * LANES)
        )
        full = torch.zeros(kp, 2 * pairs * LANES, dtype=torch.int8)
        full[: w.shape[0], : w.shape[1]] = w.to(torch.int8)  # int16-packed weights are int8 values
        tiles = full.reshape(kp // 64, 16, 4, pairs, 2, LANES)  # [c, r, byte, pair, j % 2, lane]
        return tiles.permute(3, 0, 4, 1, 5, 2).contiguous()

    return derived(nc, ("amx", kp), build)
