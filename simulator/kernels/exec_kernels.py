"""Exact whole-tensor torch kernels of the executor: integer GEMM, NHWC conv, pooling,
requantize with integer shifts, ONNX geometry attributes. (The LAYOUT data-movement ops
are :mod:`simulator.kernels.exec_layout`.)

Exactness (the results equal :mod:`simulator.arith.kernels` / :mod:`simulator.arith.intmath`
integer for integer):

- int8 x int8 GEMMs run on ``torch._int_mm`` (oneDNN VNNI, int32 accumulation). Every
  partial sum is bounded by ``128 * 128 * K = 2**14 K``, so int32 cannot wrap while
  ``K < 2**17`` (:data:`INT_MM_MAX_K`). On torch 2.13 CPU ``_int_mm`` takes any M, K, N
  (the CUDA kernel wants M > 16 and K, N multiples of 8); a backend that refuses a shape
  falls back to float64.
- Everything else (int16 operands, grouped conv, batched matmul) is a float GEMM: float32
  when the dtypes alone bound every partial sum below ``2**24`` (int8 x int8 with
  ``K < 1024``), else float64, exact while ``max|a| * max|b| * K < 2**53``, the bound
  :mod:`simulator.arith.kernels` checks; above it both raise :class:`SimulatorError`.
- Requantize is int64: ``clamp(round_div(acc * mult, 2**shift))`` with the division done
  by arithmetic shifts (``v >> s`` is ``floor(v / 2**s)``), same tie rules and the same
  overflow refusals as :func:`simulator.arith.intmath.requantize`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import MAX_SHIFT, PRODUCT_LIMIT, max_abs
from simulator.arith.kernels import check_exact

INT_MM_MAX_K = 2**17
"""int8 x int8 reductions shorter than this cannot overflow the int32 accumulator."""
TORCH_DTYPES = {"int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
                "int64": torch.int64, "float32": torch.float32}  # fmt: skip


FLOAT32_EXACT = 2**24
"""Integers below this are exact float32 numbers."""


def float_gemm_type(a: torch.Tensor, b: torch.Tensor, k: int, where: str) -> torch.dtype:
    """float32 when every partial sum is provably an exact float32 integer (dtype bound
    ``max|a| max|b| k < 2**24``, and torch's float32 matmul precision is "highest", no
    bf16/tf32 shortcuts), else float64: exact by the same dtype bound below 2**53, else
    under :func:`simulator.arith.kernels.check_exact` on the data."""
    bound = -torch.iinfo(a.dtype).min * -torch.iinfo(b.dtype).min * k
    if bound < FLOAT32_EXACT and torch.get_float32_matmul_precision() == "highest":
        return torch.float32
    if bound >= 2**53:  # the dtypes alone do not prove it: check the data (4 reductions)
        check_exact(where, a, b, k)
    return torch.float64


def gemm_int(a: torch.Tensor, b: torch.Tensor, as_float: bool = False) -> torch.Tensor:
    """Exact ``a @ b`` for 2-D integer ``a [M, K]``, ``b [K, N]``: int32 or int64 result
    (``as_float``: the exact float32/float64 result of the float path, not cast back).

    FORMULA: ``y[i, j] = sum_k a[i, k] * b[k, j]``; ``_int_mm`` for int8 x int8 with
    ``K < 2**17``, else one float GEMM under the bounds of :func:`float_gemm_type`.
    """
    k = a.shape[1]
    if a.dtype == b.dtype == torch.int8 and k < INT_MM_MAX_K and a.shape[0] > 0:
        try:
            return torch._int_mm(a.contiguous(), b)
        except RuntimeError:
            pass  # a backend with shape limits: the float path below is exact too
    ft = float_gemm_type(a, b, k, "gemm_int")
    y = torch.mm(a.to(ft), b.to(ft))
    return y if as_float else y.long()


def matmul_int(a: torch.Tensor, b: torch.Tensor, as_float: bool = False) -> torch.Tensor:
    """Exact integer ``a @ b`` with numpy/torch broadcasting matmul semantics.

    FORMULA: ``y[..., i, j] = sum_k a[..., i, k] * b[..., k, j]``. A 2-D ``b`` (weights)
    folds a's leading axes into M and goes through :func:`gemm_int`; batched operands use
    one float ``torch.matmul`` (float32 or float64, :func:`float_gemm_type`).
    """
    if a.ndim >= 2 and b.ndim == 2:
        y = gemm_int(a.reshape(-1, a.shape[-1]), b, as_float)
        return y.reshape(*a.shape[:-1], b.shape[1])
    ft = float_gemm_type(a, b, a.shape[-1], "matmul_int")
    y = torch.matmul(a.to(ft), b.to(ft))
    return y if as_float else y.long()


def pad_axes(x: torch.Tensor, axes, pads, value) -> torch.Tensor:
    """Pad ``axes`` of x, ONNX ``pads = [begin_0, begin_1, ..., end_0, end_1, ...]``."""
    nd = len(axes)
    if not any(pads):
        return x
    widths = [0] * (2 * (x.ndim - min(axes)))
    for i, ax in enumerate(axes):
        j = 2 * (x.ndim - 1 - ax)
        widths[j], widths[j + 1] = pads[i], pads[nd + i]
    return F.pad(x, widths, value=value)


def windows(x: torch.Tensor, axes, kernel, strides, dilations) -> torch.Tensor:
    """View ``(..., *out, ..., *kernel)``: windows along ``axes``, kernel axes appended last.

    FORMULA: ``view[.., o_i, .., k_i] = x[.., o_i * stride_i + k_i * dilation_i, ..]``;
    ``out_i = (size_i - dilation_i * (kernel_i - 1) - 1) // stride_i + 1``.
    """
    for ax, k, s, d in zip(axes, kernel, strides, dilations, strict=True):
        extent = d * (k - 1) + 1
        if x.shape[ax] < extent:
            raise SimulatorError(f"window {extent} larger than padded input {x.shape[ax]}")
        x = x.unfold(ax, extent, s)
    if any(d > 1 for d in dilations):
        x = x[(Ellipsis, *(slice(None, None, d) for d in dilations))]
    return x


def pack_conv(w: torch.Tensor, group: int) -> torch.Tensor:
    """GEMM operand ``[kh*kw*C, O]`` (int8, contiguous) of channels-last ``w [O, kh, kw, Cg]``.

    FORMULA: ``wmat[(i, j, g*Cg + c), o] = w[o, i, j, c]`` if ``o // (O/G) == g`` else 0:
    grouped (and depthwise) weights become one block-diagonal matrix, so every conv is a
    single ``_int_mm`` (G times the MACs of the groups alone, still far cheaper than G small
    GEMMs). Packed once per program (:class:`simulator.kernels.exec_ops.ConstPool`).
    """
    o, kh, kw, cg = w.shape
    if group < 1 or o % group:
        raise SimulatorError(f"group {group} does not divide {o} output channels")
    if group > 1:
        full = w.new_zeros(group, o // group, kh, kw, group, cg)
        g = torch.arange(group)
        full[g, :, :, :, g, :] = w.reshape(group, o // group, kh, kw, cg)
        w = full.reshape(o, kh, kw, group * cg)
    return w.reshape(o, -1).t().contiguous()


def conv_nhwc(x, wmat, kernel, strides, pads, dilations) -> torch.Tensor:
    """Exact 2-D convolution on channels-last data; int32/int64 ``[N, OH, OW, O]``.

    FORMULA: ``y[n, p, o] = sum_{i, j, c} x_pad[n, p*stride + (i, j)*dilation, c]
    * wmat[(i, j, c), o]``, ``x [N, H, W, C]``, ``wmat = pack_conv(w, group)``.
    im2col: unfold (a view), then one copy into ``[N*OH*OW, kh*kw*C]``; one :func:`gemm_int`.
    """
    (n, _, _, c), (kh, kw) = x.shape, kernel
    if wmat.shape[0] != kh * kw * c:
        raise SimulatorError(f"weights {tuple(wmat.shape)} do not fit x {tuple(x.shape)}")
    xp = pad_axes(x, (1, 2), pads, 0)
    cols = windows(xp, (1, 2), (kh, kw), strides, dilations)  # [N, OH, OW, C, kh, kw]
    oh, ow = cols.shape[1], cols.shape[2]
    cols = cols.permute(0, 1, 2, 4, 5, 3).reshape(-1, kh * kw * c)
    return gemm_int(cols, wmat).reshape(n, oh, ow, wmat.shape[1])


def _along(v: torch.Tensor, ref: torch.Tensor, axis: int | None, name: str) -> torch.Tensor:
    """Scalar or per-channel ``v`` shaped to broadcast along ``axis`` of ``ref``."""
    if v.numel() == 1:
        return v.reshape(())
    if axis is None:
        return v
    ax = axis % ref.ndim
    if v.numel() != ref.shape[ax]:
        raise SimulatorError(
            f"{v.numel()} values of {name} for {ref.shape[ax]} channels on axis {axis}",
            where="requantize",
        )
    return v.reshape([-1 if i == ax else 1 for i in range(ref.ndim)])


def round_shift(v: torch.Tensor, s: torch.Tensor, mode: str) -> torch.Tensor:
    """``round_div(v, 2**s, mode)`` for int64 ``v`` (``|v| < 2**62``) and ``0 <= s <= 62``.

    FORMULA (``h = 2**s >> 1``, ``z = [s > 0]``): bpu_round (ties away from zero)
    ``(v + h - z [v < 0]) >> s``; half_even ``(v + h - z + z (floor(v / 2**s) & 1)) >> s``.
    Equal to :func:`simulator.arith.intmath.round_div`: with ``v = fl 2**s + r``, adding
    ``h - 1`` carries iff ``r > h``, the extra 1 makes the tie ``r = h`` carry (v >= 0 /
    fl odd); ``z = 0`` leaves ``v`` unchanged. ``>>`` on int64 is floor division.
    """
    if mode not in fp.ROUNDING_MODES:
        fp.round_by(0.0, mode)  # raises the one "unknown rounding mode" error
    z = (s > 0).long()
    h = (torch.ones_like(s) << s) >> 1
    if mode == "bpu_round":
        return (v >> 63).bitwise_and_(-z).add_(v).add_(h).bitwise_right_shift_(s)
    return (v >> s).bitwise_and_(z).add_(v).add_(h - z).bitwise_right_shift_(s)


FLOAT_EXACT = 2**52
"""``|v * m|`` below this: a float64 requantize is exact in both rounding modes."""


def exact_limit(mode: str, ftype: torch.dtype = torch.float64) -> int:
    """``|v * m|`` below this: ``round(v * m * 2**-s)`` computed in ``ftype`` is exact.

    FORMULA: ``2**p`` for half_even (``round`` of an exact value; ``p`` = 53 float64,
    24 float32 mantissa bits), ``2**(p - 1)`` for bpu_round (its ``|y| + 0.5`` needs the
    spare bit: :func:`simulator.kernels.exec_epilogue.round_`).
    """
    bits = 53 if ftype == torch.float64 else 24
    return 2 ** (bits - (mode != "half_even"))


def _requant_float(acc: torch.Tensor, m: torch.Tensor, s: torch.Tensor, mode: str):
    """:func:`round_shift` of ``acc * m`` computed in float64, while ``|acc * m|`` is below
    :func:`exact_limit` (2**53 half_even, 2**52 bpu_round).

    Exact: ``acc * m`` is then an exact float64 integer, scaling by ``2**-s`` only moves the
    exponent, and rounding an exact value is exact: half_even ``round(y)``; bpu_round
    ``sign(y) * floor(|y| + 0.5)`` below 2**52: ``|y| + 0.5 = (|acc m| + 2**(s-1)) 2**-s``
    has a numerator below 2**53 for ``1 <= s <= 53`` (``s = 0``: ``|acc m| + 0.5``, exact
    below 2**52), and for ``s > 53`` ``|y| < 1/4``. At ``2**53`` it fails:
    ``(2**53 - 1) 2**-54`` would round to 1 (:func:`simulator.kernels.exec_epilogue.round_`).
    About 4x faster than the int64 bit arithmetic (measured on a 200k x 64 int32
    accumulator: 2.2 ms vs 8.8 ms).
    """
    y = acc.double().mul_(m.double() * torch.pow(2.0, -s.double()))
    if mode == "half_even":
        return y.round_()
    if mode != "bpu_round":
        fp.round_by(0.0, mode)  # raises the one "unknown rounding mode" error
    return y.abs().add_(0.5).floor_().mul_(torch.sign(y))


def requant(acc, mult, shift, out_dtype: str, rounding: str, axis: int | None) -> torch.Tensor:
    """``clamp(round_div(acc * mult, 2**shift), qrange(out_dtype))``, int64 result.

    ``mult`` ``None`` means 1. Same broadcasting and refusals as
    :func:`simulator.arith.intmath.requantize`: shift outside [0, 62] or
    ``max|acc| * max|mult| >= 2**62`` raise instead of wrapping.
    """
    qmin, qmax = fp.qrange(out_dtype)
    acc = acc.long()
    s = _along(shift.long(), acc, axis, "shift")
    if s.numel() and (int(s.min()) < 0 or int(s.max()) > MAX_SHIFT):
        raise SimulatorError(f"shift outside [0, {MAX_SHIFT}]", where="requantize")
    if mult is not None:
        m = _along(mult.long(), acc, axis, "mult")
        if max_abs(acc) * max_abs(m) < exact_limit(rounding):
            return _requant_float(acc, m, s, rounding).clamp_(qmin, qmax).long()
        if max_abs(acc) * max_abs(m) >= PRODUCT_LIMIT:
            raise SimulatorError("|acc * mult| may reach 2**62", where="requantize",
                                 hint="accumulators must fit int32 and multipliers 31 bits")  # fmt: skip
        acc = acc * m
    elif max_abs(acc) >= PRODUCT_LIMIT:
        raise SimulatorError("|acc| may reach 2**62", where="requantize")
    return round_shift(acc, s, rounding).clamp_(qmin, qmax)


def sum_exact(x: torch.Tensor, axes: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """``sum(x)`` over ``axes`` of an integer tensor as exact float64 integers
    (``n max|x| < 2**53``, the caller's bound; n = elements per sum).

    FORMULA: trailing axes of a contiguous int8 ``x``: ``x.reshape(-1, n) @ ones[n, 8]`` (one
    :func:`gemm_int`, int32 sums while ``n < 2**17``); else one float32 sum while
    ``n max|x| < 2**24`` (exact in any order), else float64. One dtype per op: torch's
    mixed-dtype reductions are 2-3x slower.
    """
    n = numel(x.shape[a] for a in axes)
    trailing = axes == tuple(range(x.ndim - len(axes), x.ndim)) and x.is_contiguous()
    if x.dtype == torch.int8 and trailing and n > 1:  # a strided view: the sum reads it as is
        keep = x.shape[: x.ndim - len(axes)]
        y = gemm_int(x.reshape(-1, n), torch.ones(n, 8, dtype=torch.int8))[:, 0].double()
        return y.reshape(*keep, *([1] * len(axes))) if keepdim else y.reshape(keep)
    ft = torch.float32 if n * -torch.iinfo(x.dtype).min < FLOAT32_EXACT else torch.float64
    return x.to(ft).sum(dim=axes, keepdim=keepdim).double()


def sum_pool(x: torch.Tensor, axes, kernel, strides, pads) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-padded window sums (int64) and real elements per window, over ``axes``.

    FORMULA: ``sums[p] = sum_k x_pad[p*stride + k]``, ``counts[p] = sum_k inside[p*stride
    + k]``; counts broadcast against sums (shape 1 on the other axes).
    """
    ones, nd = [1] * len(kernel), len(kernel)
    win = windows(pad_axes(x.long(), axes, pads, 0), axes, kernel, strides, ones)
    sums = win.sum(dim=tuple(range(-nd, 0)))
    shape = [x.shape[a] if a in axes else 1 for a in range(x.ndim)]
    inside = pad_axes(torch.ones(shape, dtype=torch.int64), axes, pads, 0)
    counts = windows(inside, axes, kernel, strides, ones).sum(dim=tuple(range(-nd, 0)))
    return sums, counts


def max_pool(x: torch.Tensor, axes, kernel, strides, pads, dilations) -> torch.Tensor:
    """Window maxima over ``axes``, padding with the dtype's minimum; keeps x's dtype.

    FORMULA: ``y[p] = max_k x_pad[p*stride + k*dilation]``, ``x_pad = qmin`` outside x.
    Separable: the maximum over a box is the maximum, axis by axis, of running maxima of
    strided slices (``kernel_i`` elementwise maxima per axis, no window copies).
    """
    x = pad_axes(x, axes, pads, torch.iinfo(x.dtype).min)
    for ax, k, s, d in zip(axes, kernel, strides, dilations, strict=True):
        extent = d * (k - 1) + 1
        if x.shape[ax] < extent:
            raise SimulatorError(f"window {extent} larger than padded input {x.shape[ax]}")
        n_out = (x.shape[ax] - extent) // s + 1
        idx = [slice(None)] * x.ndim
        y = None
        for j in range(k):
            idx[ax] = slice(j * d, j * d + (n_out - 1) * s + 1, s)
            y = x[tuple(idx)] if y is None else torch.maximum(y, x[tuple(idx)])
        x = y
    return x


def out_size(size: int, kernel: int, stride: int, pad_total: int = 0, dilation: int = 1) -> int:
    """Output length of a window op along one axis (ONNX Conv / pooling).

    FORMULA: ``(size + pad_total - dilation * (kernel - 1) - 1) // stride + 1``."""
    return (size + pad_total - dilation * (kernel - 1) - 1) // stride + 1


def geometry(nd: int, attrs: dict) -> tuple[list[int], list[int], list[int]]:
    """(strides, pads, dilations) from ONNX attrs; absent means 1s / 0s / 1s."""
    strides = [int(v) for v in attrs.get("strides") or [1] * nd]
    pads = [int(v) for v in attrs.get("pads") or [0] * 2 * nd]
    dilations = [int(v) for v in attrs.get("dilations") or [1] * nd]
    ok = len(strides) == len(dilations) == nd and len(pads) == 2 * nd
    if not ok or min(strides + dilations) < 1 or min(pads) < 0:
        raise SimulatorError(f"bad geometry: strides {strides}, pads {pads}, "
                             f"dilations {dilations} for {nd} spatial axes")  # fmt: skip
    return strides, pads, dilations


def numel(shape) -> int:
    """Number of elements of a shape (1 for ``()``)."""
    return math.prod(int(d) for d in shape)
