"""MAXPOOL, ToNHWC and strided copies through the compiled data-movement kernels
(simulator/csrc/qmove.c). No arithmetic: every output value is an input value or a zero,
so these equal their torch paths by construction (and the tests compare them).

Each function returns None (or, :func:`contiguous`, torch's copy) when its kernel does not
apply: no compiled library, a dtype or rank it does not take.
"""

from __future__ import annotations

import torch

from simulator.kernels import exec_kernels as ek
from simulator.kernels.exec_native import IN_DTYPES
from simulator.runtime import native


def maxpool(x: torch.Tensor, kernel, strides, pads, dilations):
    """MAXPOOL of ``x [N, H, W, C]`` (int8/int16) over H, W, or None (no library, another
    dtype or rank). FORMULA: ``y[n, p, c] = max over in-bounds taps k of x[n, p*stride -
    pad + k*dilation, c]`` (the dtype's minimum when no tap is in bounds)."""
    if native.library() is None or x.ndim != 4 or x.dtype not in IN_DTYPES or len(kernel) != 2:
        return None
    n, h, w, c = x.shape
    oh, ow = (ek.out_size(size, kernel[i], strides[i], pads[i] + pads[i + 2], dilations[i])
              for i, size in enumerate((h, w)))  # fmt: skip
    if min(oh, ow) < 1:
        return None  # the torch path names the geometry error
    x = x.contiguous()
    out = native.empty((n, oh, ow, c), dtype=x.dtype)
    native.library().qp_maxpool(native.ptr(x), native.code(x), n, h, w, c, *kernel, *strides,
                                *dilations, pads[0], pads[1], oh, ow, native.ptr(out))  # fmt: skip
    return out


def to_nhwc(x: torch.Tensor, padded: int):
    """LAYOUT ToNHWC of ``x [N, C, H, W]`` (int8/int16, ``C < padded <= 32``) as ``[N, H,
    W, padded]`` with channels ``C..padded`` zero, or None."""
    lib = native.library()
    if lib is None or x.ndim != 4 or x.dtype not in IN_DTYPES or not x.shape[1] < padded <= 32:
        return None
    n, c, h, w = x.shape
    x, out = x.contiguous(), native.empty((n, h, w, padded), dtype=x.dtype)
    lib.qp_to_nhwc(native.ptr(x), native.code(x), n, c, h * w, padded, native.ptr(out))
    return out


def contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous()``, a strided view of up to 6 axes copied in one compiled pass
    (torch's copy of a permuted int8 tensor is several times slower). The kernel splits
    its two outer axes over the threads, so the axes of size 1 that pad a view to 6 go
    after the view's first two (after its first of two): ``[B, H, T, D]`` as ``[B, H, 1,
    1, T, D]``, not ``[1, 1, B, H, T, D]``, which ran on one thread."""
    if x.is_contiguous() or native.library() is None or x.ndim > 6 or not x.numel():
        return x.contiguous()
    k, pad = min(2, x.ndim - 1), 6 - x.ndim
    shape = native.int64s(*x.shape[:k], *(1,) * pad, *x.shape[k:])
    stride = native.int64s(*x.stride()[:k], *(0,) * pad, *x.stride()[k:])
    out = native.empty(x.shape, dtype=x.dtype)
    base = native.ptr(x)  # the view's first element (storage offset applied)
    native.library().qp_copy(base, x.element_size(), shape, stride, native.ptr(out))
    return out


def clip(x: torch.Tensor, lo: int, hi: int):
    """CLIP of ``x`` (int8/int16; ``lo``, ``hi`` within its range) over its memory as it lies:
    contiguous, or an NCHW view of NHWC memory (a grouped conv's output, returned in the same
    layout), or None. FORMULA: ``y = min(max(x, lo), hi)``."""
    lib = native.library()
    if lib is None or x.dtype not in IN_DTYPES or not x.numel():
        return None
    nhwc_view = x.ndim == 4 and not x.is_contiguous() and x.permute(0, 2, 3, 1).is_contiguous()
    if not (x.is_contiguous() or nhwc_view):
        return None
    dense = x.permute(0, 2, 3, 1) if nhwc_view else x
    out = native.empty(dense.shape, dtype=x.dtype)
    wide = int(x.dtype == torch.int16)
    lib.qp_clip(native.ptr(dense), wide, x.numel(), lo, hi, native.ptr(out))
    return out.permute(0, 3, 1, 2) if nhwc_view else out
