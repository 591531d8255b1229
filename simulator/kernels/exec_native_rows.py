"""REDUCE_MEAN, QMul, QAdd, REQUANT, batched QMatMul, the LUT gather, QUANTIZE and
DEQUANTIZE through the compiled row kernels (simulator/csrc/qrows.c, qbmm.c, qquant.c).

Each function returns None when its kernel does not apply (no compiled library, a layout
or dtype it does not take, a bound not met); the caller then keeps its torch path. The
kernels evaluate the torch path's float64 formulas operation for operation:

- :func:`mean`: FORMULA ``y[r] = clamp(round(fl(S[r] * m) / (n * 2**s)))`` with
  ``S[r] = sum_i x[r, i]`` over a block of adjacent axes (:func:`simulator.kernels.exec_pool._divide_float`,
  exact while ``n * max|x| * |m| < 2**50``: :func:`exec_epilogue.round_quotient`);
- :func:`mul`: FORMULA ``y = clamp(round(a * b * m * 2**-s))`` with a scalar
  ``m``/``s``, exact while ``max|a| max|b| |m|`` is below the float64
  :func:`~simulator.kernels.exec_kernels.exact_limit` (:func:`exec_epilogue.scaled_epilogue`).
  ``b`` has ``a``'s shape or is constant along ``a``'s trailing axes (a per-row operand
  such as ``[N, C, 1, 1]`` against ``[N, C, H, W]``); the product commutes, so the
  operands may come in either order;
- :func:`add`: FORMULA ``y = clamp(round(a * sa + b * sb))`` on the scales of
  :func:`exec_epilogue.add_epilogue` (which proves the bound); :func:`requant` is that
  kernel with ``b = a``, ``sb = 0``;
- :func:`gather`: a dense table lookup ``values[clamp(q) - qmin]`` (LUT);
- :func:`quantize`: float input to int8/int16 in x's float type (QUANTIZE);
- :func:`dequantize`: ``float32(q) * float32(s)`` (DEQUANTIZE, one float32 rounding as in
  torch);
- :func:`bmm`: FORMULA ``y = clamp(round(sum_k a[.., i, k] b[.., k, j] * m * 2**-s))`` on
  the scale of :func:`exec_epilogue.scaled_epilogue` (bound ``max|a| max|b| K |m|``); the
  sum of exact products stays exact in float64 below that bound.

Channels-last views (:func:`channels_last`: an NHWC buffer seen as NCHW, as LAYOUT
ToNCHW leaves it) are read in place: the mean over H, W sums channel vectors, and the
per-row product writes an NHWC buffer and returns it as the same kind of view, so a
squeeze-excite block (mean, gate, product, mean) never transposes.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from simulator.arith import fixedpoint as fp
from simulator.kernels.exec_epilogue import QUOTIENT_EXACT, dtype_bound, out_range
from simulator.kernels.exec_kernels import TORCH_DTYPES, exact_limit
from simulator.kernels.exec_native import IN_DTYPES, INT_DTYPES, lanes
from simulator.runtime import native
from simulator.runtime.memo import as_int, derived

OUT_NAMES = ("int8", "int16", "int32")
"""Output dtypes of the row kernels (:func:`simulator.runtime.native.code` 0, 1, 2)."""


def _bounds(attrs: dict) -> tuple[float, float]:
    """:func:`~simulator.kernels.exec_epilogue.out_range` as floats."""
    lo, hi = out_range(attrs)
    return float(lo), float(hi)


def _usable(attrs: dict, *xs: torch.Tensor) -> bool:
    ok = native.library() is not None and attrs.get("out_dtype") in OUT_NAMES
    ok = ok and attrs.get("rounding") in fp.ROUNDING_MODES
    return ok and all(x.dtype in IN_DTYPES for x in xs)


def channels_last(x: torch.Tensor) -> tuple[int, int] | None:
    """``(pix, img)`` when ``x [N, C, H, W]`` is a channels-last view (an NHWC buffer,
    maybe with padding channels, seen as NCHW): ``x[n, c, h, w]`` at
    ``n * img + (h * W + w) * pix + c``; else None."""
    if x.ndim != 4:
        return None
    sn, sc, sh, sw = x.stride()
    ok = sc == 1 and sw >= x.shape[1] and sh == x.shape[3] * sw and sn >= x.shape[2] * sh
    return (sw, sn) if ok else None


def mean(x: torch.Tensor, axes: tuple[int, ...], keep: bool, mult, shift, attrs: dict):
    """REDUCE_MEAN of ``x`` over ``axes`` (sorted), or None (module docstring): one block
    of adjacent axes of a contiguous tensor (trailing, or between leading and trailing
    ones: a mean over tokens), or H, W of a :func:`channels_last` one."""
    block = bool(axes) and axes == tuple(range(axes[0], axes[-1] + 1))
    if not (_usable(attrs, x) and block and x.numel()):
        return None
    if mult.numel() != 1 or shift.numel() != 1:
        return None
    m, s = as_int(mult), as_int(shift)
    n = math.prod(x.shape[a] for a in axes)
    if not 0 <= s <= 62 or n * dtype_bound(x.dtype) * abs(m) >= QUOTIENT_EXACT:
        return None
    lead, rest = x.shape[: axes[0]], x.shape[axes[-1] + 1 :]
    out = native.empty(math.prod(lead) * math.prod(rest), dtype=TORCH_DTYPES[attrs["out_dtype"]])
    lib, wide = native.library(), native.code(x)
    tail = (float(m), n * 2.0**s, *_bounds(attrs), int(attrs["rounding"] == "half_even"),
            native.ptr(out), native.code(out))  # fmt: skip
    cl = channels_last(x) if axes == (2, 3) and not x.is_contiguous() else None
    if cl is not None:
        lib.qp_mean_cl(native.ptr(x), wide, x.shape[0], n, x.shape[1], *cl, *tail)
    elif rest:  # x[l, i, t] at (l * n + i) * c + t: the channels-last walk with pix = c
        x, c = x.contiguous(), math.prod(rest)
        lib.qp_mean_cl(native.ptr(x), wide, math.prod(lead), n, c, c, n * c, *tail)
    else:
        x = x.contiguous()
        lib.qp_mean(native.ptr(x), wide, out.numel(), n, *tail)
    return out.reshape((*lead, *([1] * len(axes) if keep else []), *rest))


def _per_row(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``b`` constant along ``a``'s trailing axes: ``b.shape == a.shape[:j] + (1,) * k``."""
    if b.ndim != a.ndim:
        return False
    j = a.ndim
    while j > 0 and b.shape[j - 1] == 1:
        j -= 1
    return j < a.ndim and tuple(b.shape[:j]) == tuple(a.shape[:j])


def mul(a: torch.Tensor, b: torch.Tensor, mult, shift, attrs: dict):
    """QMul ``req(a * b, mult, shift)``, or None (module docstring)."""
    if not _usable(attrs, a, b) or mult.numel() != 1 or shift.numel() != 1:
        return None
    if tuple(a.shape) != tuple(b.shape) and _per_row(b, a):
        a, b = b, a  # the broadcast operand second
    same = tuple(a.shape) == tuple(b.shape)
    if not (same or _per_row(a, b)) or not a.numel():
        return None
    m, s = as_int(mult), as_int(shift)
    bound = dtype_bound(a.dtype) * dtype_bound(b.dtype) * abs(m)
    if not 0 <= s <= 62 or bound >= exact_limit(attrs["rounding"]):
        return None
    dtype, lib = TORCH_DTYPES[attrs["out_dtype"]], native.library()
    tail = (m * 2.0**-s, *_bounds(attrs), int(attrs["rounding"] == "half_even"))
    wa, wb = native.code(a), native.code(b)
    cl = None if same or a.is_contiguous() else channels_last(a)
    if cl is not None and b.shape[2:] == (1, 1):  # [N, C, H, W] view x [N, C, 1, 1]
        n, c, h, w = a.shape
        out = native.empty((n, h, w, c), dtype=dtype)
        lib.qp_mul_cl(native.ptr(a), wa, native.ptr(b.contiguous()), wb, n, h * w, c, *cl,
                      *tail, native.ptr(out), native.code(out))  # fmt: skip
        return out.permute(0, 3, 1, 2)  # channels-last, as the input
    a, b = a.contiguous(), b.contiguous()
    rows = a.numel() // max(a.shape[-1], 1) if same and a.ndim else b.numel()
    out = native.empty(a.shape, dtype=dtype)
    lib.qp_mul(native.ptr(a), wa, native.ptr(b), wb, rows, a.numel() // rows, int(not same),
               *tail, native.ptr(out), native.code(out))  # fmt: skip
    return out


def _epi_args(epi) -> tuple:
    """``(lo, hi, half_even)`` of an :class:`~simulator.kernels.exec_epilogue.Epilogue`."""
    return float(epi.lo), float(epi.hi), int(epi.rounding == "half_even")


def _trailing(big: torch.Tensor, small: torch.Tensor) -> bool:
    """``small`` is ``big``'s trailing axes, maybe behind leading 1s (a broadcast constant)."""
    dims = list(small.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return len(dims) <= big.ndim and tuple(big.shape[big.ndim - len(dims) :]) == tuple(dims)


def _on_last_axis(v: torch.Tensor, c: int) -> bool:
    return v.numel() == 1 or (v.numel() == c and v.shape[-1] == c)


def add(a: torch.Tensor, b: torch.Tensor, epi, attrs: dict):
    """QAdd ``clamp(round(a * sa + b * sb))`` with ``epi`` from
    :func:`~simulator.kernels.exec_epilogue.add_epilogue` (its bounds proven), or None: ``b`` of
    ``a``'s shape or broadcast over leading axes (either order), ``sa``/``sb`` scalars or
    per channel of the last axis, int8/int16/int32 operands."""
    if epi is None or native.library() is None or attrs.get("out_dtype") not in OUT_NAMES:
        return None
    sa, sb = epi.scale, epi.scale_b
    swap = tuple(a.shape) != tuple(b.shape) and _trailing(b, a) and not _trailing(a, b)
    if swap:
        a, b, sa, sb = b, a, sb, sa  # the broadcast operand second
    c = a.shape[-1] if a.ndim else 1
    ok = a.dtype in INT_DTYPES and b.dtype in INT_DTYPES and a.numel() and _trailing(a, b)
    ok = ok and b.ndim > 0 and b.shape[-1] == c  # whole rows of b: it repeats every b.numel()
    if not ok or not (_on_last_axis(sa, c) and _on_last_axis(sb, c)):
        return None
    a, b = a.contiguous(), b.contiguous()
    scales = derived(
        epi,
        ("lanes", c),
        lambda: tuple(lanes(v, c, epi.ftype) for v in (epi.scale, epi.scale_b)),
    )
    sa, sb = scales[::-1] if swap else scales
    out = native.empty(a.shape, dtype=TORCH_DTYPES[attrs["out_dtype"]])
    single = int(epi.ftype == torch.float32)  # the epilogue's proof: exact in float32
    native.library().qp_add(native.ptr(a), native.code(a), native.ptr(b), native.code(b),
                            a.numel() // c, c, b.numel(), native.ptr(sa), native.ptr(sb),
                            single, *_epi_args(epi), native.ptr(out), native.code(out))  # fmt: skip
    return out


def requant(x: torch.Tensor, epi, attrs: dict):
    """QRequant ``clamp(round(x * s))`` with ``epi`` from
    :func:`~simulator.kernels.exec_epilogue.scaled_epilogue` (no bias; ``s`` a scalar or per
    channel of the last axis), or None: the QAdd kernel on ``(x, x)`` with a zero second
    scale (``x * s + x * 0`` is ``x * s`` exactly)."""
    if epi is None or epi.bias is not None or epi.scale is None or epi.scale_b is not None:
        return None
    as_add = derived(epi, "as_add", lambda: dataclasses.replace(epi, scale_b=torch.zeros(())))
    return add(x, x, as_add, attrs)


def bmm(a: torch.Tensor, b: torch.Tensor, epi, attrs: dict):
    """Batched QMatMul ``clamp(round(a @ b * m 2**-s))`` with ``epi`` from
    :func:`~simulator.kernels.exec_epilogue.scaled_epilogue` (bound ``max|a| max|b| K |m|``
    proven), or None: same batch axes, int8/int16, a scalar multiplier."""
    if epi is None or native.library() is None or not _usable(attrs, a, b):
        return None
    if a.ndim < 3 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        return None
    if epi.scale is None or epi.scale.numel() != 1 or not a.numel() or not b.numel():
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    out = native.empty((*a.shape[:-1], n), dtype=TORCH_DTYPES[attrs["out_dtype"]])
    small = m * k <= BMM_BUF and -(-n // 8) * 8 * k <= BMM_BUF
    pairs = _pairs(a, b)
    if a.ndim <= 4 and (pairs or small and not (a.is_contiguous() and b.is_contiguous())):
        (nb1, nb2), sa, sb = _batch2(a.shape), _strides4(a), _strides4(b)
        fn = native.library().qp_bmm_pairs if pairs else native.library().qp_bmm_strided
        fn(native.ptr(a), native.code(a), sa, native.ptr(b), native.code(b), sb, nb1, nb2, m, k,
           n, float(epi.scale), *_epi_args(epi), native.ptr(out), native.code(out))  # fmt: skip
        return out  # views (a transposed k, a head split) read in place
    a, b = a.contiguous(), b.contiguous()
    native.library().qp_bmm(native.ptr(a), native.code(a), native.ptr(b), native.code(b),
                            a.numel() // (m * k), m, k, n, float(epi.scale), *_epi_args(epi),
                            native.ptr(out), native.code(out))  # fmt: skip
    return out


BMM_BUF = 4096
"""qbmm.c's float64 buffer per batch (values): operands that fit are widened once."""


def _pairs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether qbmm.c's VPDPWSSD form takes ``a @ b``: ``K <= 32``, ``N <= 16``, a's rows
    and b's rows or columns contiguous, and FORMULA ``K max|a| max|b| < 2**31`` from the
    dtypes (int8 128, int16 32768), so the int32 sums are exact."""
    (k, n), big = b.shape[-2:], 2**31
    if k > 32 or n > 16 or a.stride(-1) != 1 or 1 not in b.stride()[-2:]:
        return False
    return k * dtype_bound(a.dtype) * dtype_bound(b.dtype) < big


def _batch2(shape) -> tuple[int, int]:
    """The batch axes of a 3-D or 4-D operand as two sizes ``(nb1, nb2)``."""
    return (1, shape[0]) if len(shape) == 3 else (shape[0], shape[1])


def _strides4(t: torch.Tensor):
    """Element strides ``[batch1, batch2, row, col]`` of a 3-D or 4-D tensor (a C array)."""
    return native.int64s(*((0,) if t.ndim == 3 else ()), *t.stride())


def gather(values: torch.Tensor, qmin: int, qmax: int, q: torch.Tensor):
    """``values[clamp(q, qmin, qmax) - qmin]`` (a dense table, :class:`exec_dense.Dense`)
    in one pass, or None: integer ``q`` and ``values`` of int8 / int16 / int32 (exact: the
    same entries, the same clamp)."""
    if native.library() is None or q.dtype not in INT_DTYPES or values.dtype not in INT_DTYPES:
        return None
    if not values.is_contiguous() or values.numel() != qmax - qmin + 1:
        return None
    if not -(2**31) <= qmin <= qmax < 2**31 or values.data_ptr() % values.element_size():
        return None  # qrows.c's word gather needs entries aligned to their size
    q = q.contiguous()
    out = native.empty(q.shape, dtype=values.dtype)
    native.library().qp_gather(native.ptr(q), native.code(q), q.numel(), qmin, qmax,
                               native.ptr(values), native.code(values), native.ptr(out))  # fmt: skip
    return out


def quantize(x: torch.Tensor, scale: torch.Tensor, axis: int | None, dtype: str, mode: str):
    """QUANTIZE ``clamp(round_by(x / s), qrange(dtype))`` of a float32/float64 ``x`` in its
    own float type (``s`` cast to it; per channel along ``axis`` or one value), or None:
    other dtypes, or a non-finite ``x / s`` anywhere (the torch path then decides).

    FORMULA: :func:`simulator.arith.fixedpoint.round_by` (bpu_round as ``round_half_away``:
    ``t = trunc(q)``, ``t + sign(q)`` when ``|q - t| >= 0.5``), then the clamp; the int8 /
    int16 bounds are exact floats, so the clamped value casts exactly."""
    ok = native.library() is not None and x.dtype in (torch.float32, torch.float64)
    if not ok or dtype not in ("int8", "int16") or mode not in fp.ROUNDING_MODES:
        return None
    if not x.numel() or (axis is not None and scale.numel() != x.shape[axis]):
        return None
    x = x.contiguous()
    c = 1 if axis is None else x.shape[axis]
    inner = x.numel() if axis is None else math.prod(x.shape[axis + 1 :])
    scales = derived(
        scale,
        ("quantize", x.dtype),  # x's float type, as the torch path
        lambda: scale.to(x.dtype).double().reshape(-1).contiguous(),
    )
    out = native.empty(x.shape, dtype=TORCH_DTYPES[dtype])
    lo, hi = fp.qrange(dtype)
    bad = native.library().qp_quantize(native.ptr(x), int(x.dtype == torch.float64),
                                       x.numel() // (c * inner), c, inner, native.ptr(scales),
                                       int(mode == "half_even"), float(lo), float(hi),
                                       native.ptr(out), native.code(out))  # fmt: skip
    return None if bad else out


def dequantize(q: torch.Tensor, scale: torch.Tensor, axis: int | None):
    """DEQUANTIZE ``float32(q) * s`` (``s`` float32: one value, or per channel along
    ``axis``) in one pass, or None: no library, a dtype it does not take."""
    if native.library() is None or q.dtype not in INT_DTYPES or not q.numel():
        return None
    q = q.contiguous()
    if axis is None:  # one scale: rows of the last axis, all scaled alike
        inner = q.shape[-1] if q.ndim and q.shape[-1] else q.numel()
        outer, c = q.numel() // inner, 1
    else:
        outer, c, inner = math.prod(q.shape[:axis]), q.shape[axis], math.prod(q.shape[axis + 1 :])
    if scale.numel() != c:
        return None
    s = derived(scale, "f32", lambda: scale.float().reshape(-1).contiguous())
    out = native.empty(q.shape, dtype=torch.float32)
    native.library().qp_dequantize(native.ptr(q), native.code(q), outer, c, inner,
                                   native.ptr(s), native.ptr(out))  # fmt: skip
    return out
