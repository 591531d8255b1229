"""Exact integer kernels of the modelled BPU: convolution, matmul, sum and max pooling.

Integer arrays in, exact int64 out (``max_pool_int`` keeps the input dtype), whole-array
numpy only. Layouts follow ONNX: ``x`` is (N, C, *spatial), conv weights
(O, C/group, *kernel), ``pads`` is ``[begin_0, begin_1, ..., end_0, end_1, ...]``.

Exactness of the float64 GEMMs (conv, matmul): float64 is 30-60x faster than numpy
integer matmul (docs/environment.md, "Exact integer arithmetic"). Every product and every
partial sum of an output is an integer bounded by ``B = max|x| * max|w| * K`` (K = terms per output). While ``B < 2**53`` each of
them is exactly representable, so each float64 multiply/add is exact whatever order or
blocking BLAS uses, and the result equals the integer sum. int8 x int8 allows
``K < 2**39``, int16 x int8 ``K < 2**31``. ``_check_exact`` raises above the bound
(two reductions over the operands, cheap next to the GEMM).

A convolution runs in float32 instead (half the bytes, about twice the GEMM rate) when
``max|x| * max_o sum_k |w[o, k]| < 2**24`` (:func:`gemm_dtype`): every partial sum of
output channel ``o`` is a sum of a subset of its terms, so its magnitude is at most
``max|x| * sum_k |w[o, k]|``, and every integer below ``2**24`` is a float32. Most int8
convs pass: 50 of the 53 of torchvision's ResNet-50 at 224 (bench/zoo, convert's
quantized.onnx, with ``max|x|`` taken as 128); int16 inputs seldom do. At 56x56, one
sample, a 3x3 256 -> 256 conv took 78-83 ms against 168-181 ms in float64, a 1x1
256 -> 64 one 3.6-3.7 ms against 6.5-6.7.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from schemas.errors import SimulatorError
from simulator.arith.intmath import max_abs

EXACT_LIMIT = 2**53
"""Largest magnitude below which every float64 integer sum is exact."""
FLOAT32_LIMIT = 2**24
"""Largest magnitude below which every float32 integer sum is exact."""


def _ints(name: str, x, where: str) -> np.ndarray:
    """``x`` as a numpy integer array, or a SimulatorError naming it."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer):
        raise SimulatorError(f"{name} must be an integer array, got {x.dtype}", where=where)
    return x


def check_exact(where: str, a: np.ndarray, b: np.ndarray, k: int, a_max: int | None = None):
    """Raise unless ``max|a| * max|b| * k < 2**53`` (float64 sums then exact); ``a_max``:
    ``max|a|`` when the caller has it already."""
    bound = (max_abs(a) if a_max is None else a_max) * max_abs(b) * k
    if bound >= EXACT_LIMIT:
        raise SimulatorError(
            f"accumulator bound {bound} reaches 2**53: float64 would round",
            where=where,
            hint="integer kernels take int8/int16 data with moderate reduction sizes",
        )


def gemm_dtype(x_max: int, w: np.ndarray) -> type:
    """float32 when ``x_max * max_o sum_k |w[o, k]| < 2**24`` (``w``'s first axis is the
    output channel; module docstring), else float64."""
    rows = np.abs(w.reshape(w.shape[0], -1).astype(np.int64)).sum(axis=1)
    bound = x_max * int(rows.max(initial=0))
    return np.float32 if bound < FLOAT32_LIMIT else np.float64


def _geometry(nd: int, strides, pads, dilations, where: str):
    """Validated (strides, pads, dilations) tuples; ``None`` means 1s / 0s / 1s."""
    strides = tuple(int(v) for v in (strides if strides is not None else [1] * nd))
    pads = tuple(int(v) for v in (pads if pads is not None else [0] * 2 * nd))
    dilations = tuple(int(v) for v in (dilations if dilations is not None else [1] * nd))
    ok = len(strides) == len(dilations) == nd and len(pads) == 2 * nd
    if not ok or min(strides + dilations) < 1 or (pads and min(pads) < 0):
        raise SimulatorError(
            f"bad geometry for {nd} spatial axes: strides {strides}, pads {pads}, "
            f"dilations {dilations}",
            where=where,
            hint="strides/dilations: one positive int per axis; pads: 2 per axis, >= 0",
        )
    return strides, pads, dilations


def _pad(x: np.ndarray, pads: tuple[int, ...], value) -> np.ndarray:
    """Pad the last ``len(pads) // 2`` axes, ONNX order ``[begins..., ends...]``."""
    nd = len(pads) // 2
    widths = [(0, 0)] * (x.ndim - nd) + list(zip(pads[:nd], pads[nd:], strict=True))
    return np.pad(x, widths, constant_values=value)


def _windows(xp: np.ndarray, kernel, strides, dilations, where: str) -> np.ndarray:
    """Strided view ``(..., *out, *kernel)`` of the windows over the last axes of ``xp``.

    FORMULA: ``view[..., o_i, k_i] = xp[..., o_i * stride_i + k_i * dilation_i]``;
    ``out_i = (padded_i - dilation_i * (kernel_i - 1) - 1) // stride_i + 1``.
    """
    nd = len(kernel)
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilations, strict=True)]
    if any(p < e for p, e in zip(xp.shape[-nd:], extent, strict=True)) or min(kernel) < 1:
        raise SimulatorError(
            f"window {tuple(extent)} larger than padded input {xp.shape[-nd:]}", where=where
        )
    view = sliding_window_view(xp, extent, axis=tuple(range(xp.ndim - nd, xp.ndim)))
    steps = [slice(None, None, s) for s in strides] + [slice(None, None, d) for d in dilations]
    return view[(Ellipsis, *steps)]


def conv_int(x, w, strides=None, pads=None, dilations=None, group: int = 1) -> np.ndarray:
    """Exact grouped 1-D/2-D convolution (ONNX Conv semantics, no bias), int64.

    FORMULA: ``y[n, o, p] = sum_{c, k} x_pad[n, g*Cg + c, p*stride + k*dilation]
    * w[o, c, k]`` with ``g = o // (O / group)``, ``Cg = C / group``, zero padding.
    im2col (a strided window view) + one float64 matmul per group; exact while
    ``max|x| * max|w| * Cg * prod(kernel) < 2**53`` (module docstring), else raises.
    """
    x, w = _ints("x", x, "conv_int"), _ints("w", w, "conv_int")
    nd = x.ndim - 2
    if nd not in (1, 2) or w.ndim != x.ndim:
        raise SimulatorError(f"conv_int takes 3-D/4-D x and w, got {x.shape}, {w.shape}")
    (n, c), (o, cg), kernel = x.shape[:2], w.shape[:2], w.shape[2:]
    if group < 1 or c % group or o % group or cg * group != c:
        raise SimulatorError(
            f"group {group} does not fit x {x.shape} and w {w.shape}", where="conv_int"
        )
    strides, pads, dilations = _geometry(nd, strides, pads, dilations, "conv_int")
    k = cg * math.prod(kernel)
    x_max = max_abs(x)
    check_exact("conv_int", x, w, k, x_max)
    dtype = gemm_dtype(x_max, w)
    xp = _pad(x.astype(dtype), pads, 0)
    if cg == 1 or (group == 1 and math.prod(kernel) == 1):
        return _conv_by_taps(xp, w, kernel, strides, dilations, group)
    cols = _windows(xp, kernel, strides, dilations, "conv_int")
    out = cols.shape[2 : 2 + nd]
    cols = cols.reshape(n, group, cg, *out, *kernel)
    cols = np.moveaxis(cols, (1, 2), (0, 2 + nd)).reshape(group, -1, k)  # (G, N*P, K)
    wm = w.astype(xp.dtype).reshape(group, o // group, k)
    acc = np.matmul(cols, wm.transpose(0, 2, 1)).reshape(group, n, *out, o // group)
    acc = np.moveaxis(acc, (0, -1), (1, 2))  # (N, G, O/G, *out)
    return acc.reshape(n, o, *out).astype(np.int64)


def _conv_by_taps(xp: np.ndarray, w: np.ndarray, kernel, strides, dilations, group: int):
    """Depthwise (one input channel per group) and 1x1 convolutions without im2col: one
    term per kernel tap, ``y += window(xp, tap) * w[..., tap]`` (depthwise: per channel; 1x1:
    a matmul over channels). Same exactness bound as :func:`conv_int` (every partial sum is
    an integer below ``2**53``), about 10x faster at 224x224 (no window copies). Computes
    in ``xp``'s dtype (:func:`gemm_dtype`)."""
    view = _windows(xp, kernel, strides, dilations, "conv_int")  # (N, C, *out, *kernel)
    nd, (o, cg) = len(kernel), w.shape[:2]
    wf = w.astype(xp.dtype)
    if cg == 1:  # depthwise: output channel o reads input channel o // (O / group)
        view = np.repeat(view, o // group, axis=1) if o != group else view
        acc = np.zeros(view.shape[: 2 + nd], xp.dtype)
        term = np.empty_like(acc)
        for tap in np.ndindex(*kernel):
            w_tap = wf[(slice(None), 0, *tap)].reshape(-1, *[1] * nd)
            acc += np.multiply(view[(Ellipsis, *tap)], w_tap, out=term)
        return acc.astype(np.int64)
    flat = view[(Ellipsis, *[0] * nd)]  # 1x1: (N, C, *out)
    n, c, out = flat.shape[0], flat.shape[1], flat.shape[2:]
    acc = np.matmul(wf.reshape(o, c), np.ascontiguousarray(flat).reshape(n, c, -1))
    return acc.reshape(n, o, *out).astype(np.int64)


def matmul_int(a, b) -> np.ndarray:
    """Exact integer ``a @ b`` with numpy (batched, broadcasting) matmul semantics, int64.

    FORMULA: ``y[..., i, j] = sum_k a[..., i, k] * b[..., k, j]``; one float64 matmul,
    exact while ``max|a| * max|b| * K < 2**53`` (module docstring), else raises.
    """
    a, b = _ints("a", a, "matmul_int"), _ints("b", b, "matmul_int")
    if a.ndim == 0 or b.ndim == 0:
        raise SimulatorError("matmul_int takes arrays of at least 1 dimension")
    check_exact("matmul_int", a, b, a.shape[-1])
    try:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)
    except ValueError as e:
        raise SimulatorError(f"matmul shapes {a.shape} @ {b.shape}: {e}") from e


def sum_pool_int(x, kernel, strides=None, pads=None) -> tuple[np.ndarray, np.ndarray]:
    """Window sums with zero padding and the number of real (non-pad) elements per window.

    FORMULA: ``sums[..., p] = sum_k x_pad[..., p*stride + k]``,
    ``counts[..., p] = sum_k inside[p*stride + k]`` (1 on real positions, 0 on padding);
    both int64 and of the same shape. The pooled axes are the last ``len(kernel)``.
    """
    x = _ints("x", x, "sum_pool_int")
    nd = len(kernel)
    strides, pads, ones = _geometry(nd, strides, pads, None, "sum_pool_int")
    axes = tuple(range(-nd, 0))
    win = _windows(_pad(x.astype(np.int64), pads, 0), kernel, strides, ones, "sum_pool_int")
    inside = _pad(np.ones(x.shape[-nd:], np.int64), pads, 0)
    counts = _windows(inside, kernel, strides, ones, "sum_pool_int").sum(axis=axes)
    sums = win.sum(axis=axes)
    return sums, np.broadcast_to(counts, sums.shape).copy()


def max_pool_int(x, kernel, strides=None, pads=None, dilations=None) -> np.ndarray:
    """Window maxima; padding holds the dtype's minimum, so it never wins over real data.

    FORMULA: ``y[..., p] = max_k x_pad[..., p*stride + k*dilation]``, ``x_pad = qmin``
    outside ``x`` (int8: -128). Keeps x's dtype; pooled axes are the last ``len(kernel)``.
    """
    x = _ints("x", x, "max_pool_int")
    nd = len(kernel)
    strides, pads, dilations = _geometry(nd, strides, pads, dilations, "max_pool_int")
    xp = _pad(x, pads, np.iinfo(x.dtype).min)
    win = _windows(xp, kernel, strides, dilations, "max_pool_int")
    return win.max(axis=tuple(range(-nd, 0)))
