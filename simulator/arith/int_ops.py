"""Integer ONNX ops of quantized.onnx (domain ``qparity``): one BPU node each.

:data:`INT_OPS` maps an op type to ``evaluate(inputs, attrs) -> np.ndarray``; the inputs
are numpy integer arrays in the order listed per op (an empty array or ``None`` for an
absent optional one), ``attrs`` the node's attributes as Python values. Registered in
:data:`simulator.arith.custom_ops.CUSTOM_OPS` with :func:`encode` (the converter builds attrs
and initializers itself). No state: every op is a pure function of its inputs.

Shared attributes: ``rounding`` (``half_even`` | ``bpu_round``), ``out_dtype`` (``int8`` |
``int16`` | ``int32``: the result dtype, saturated to its range), ``relu`` (0/1: clamp
at 0 after requantize), ``clip`` (QConv: ``[lo, hi]`` with ``lo <= 0 <= hi``, a QClip
compile fused into the conv: ``min(max(y, lo), hi)`` after the relu). ``req(acc, m, s)`` below is :func:`simulator.arith.intmath.requantize`
``= clamp(round_div(acc * m, 2**s), qrange(out_dtype))``, int64 inside, one rounding.
"""

from __future__ import annotations

import math

import numpy as np

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import MAX_SHIFT, PRODUCT_LIMIT, clamp, max_abs, requantize, round_div
from simulator.arith.kernels import conv_int, matmul_int, max_pool_int, sum_pool_int

NP_DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32}
_REQUIRED = object()


def encode(attrs: dict, inits: dict) -> tuple[dict, dict]:
    """Identity: the converter already builds attributes and initializers."""
    return attrs, inits


def _attr(attrs: dict, name: str, op: str, default=_REQUIRED):
    if attrs.get(name) is not None:
        return attrs[name]
    if default is _REQUIRED:
        raise SimulatorError(f"{op} needs attribute {name!r}", where=f"qparity.{op}")
    return default


def _inputs(op: str, inputs: list, want: int) -> list[np.ndarray]:
    """The inputs as numpy arrays (``None`` -> empty int64), checking their number."""
    if len(inputs) != want:
        raise SimulatorError(
            f"{op} got {len(inputs)} inputs, expected {want}",
            where=f"qparity.{op}",
            hint="see simulator/arith/int_ops.py for each op's inputs",
        )
    return [np.zeros(0, np.int64) if v is None else np.asarray(v) for v in inputs]


def _scalar(v: np.ndarray, name: str, op: str) -> int:
    if v.size != 1:
        raise SimulatorError(f"{op} takes one {name}, got {v.size}", where=f"qparity.{op}")
    return int(v.reshape(()))


def _finish(y: np.ndarray, attrs: dict, op: str) -> np.ndarray:
    """``max(y, 0)`` if ``relu``, clamped to ``clip`` when set, then cast to ``out_dtype``
    (y already saturated)."""
    if int(_attr(attrs, "relu", op, 0)):
        y = np.maximum(y, 0)
    if attrs.get("clip") is not None:
        y = np.clip(y, *(int(v) for v in attrs["clip"]))
    return y.astype(NP_DTYPES[_attr(attrs, "out_dtype", op)])


def _requant(acc, mult, shift, attrs: dict, op: str, axis: int | None) -> np.ndarray:
    """``req(acc, mult, shift)``; empty mult/shift with ``out_dtype`` int32: saturate only."""
    dtype = _attr(attrs, "out_dtype", op)
    if mult.size == 0 or shift.size == 0:
        if dtype != "int32":
            raise SimulatorError(
                f"{op} has no mult/shift but out_dtype {dtype}", where=f"qparity.{op}"
            )
        return _finish(clamp(acc, *fp.qrange("int32")), attrs, op)
    y = requantize(acc, mult, shift, dtype, _attr(attrs, "rounding", op), axis=axis)
    return _finish(y, attrs, op)


def _with_bias(acc: np.ndarray, bias: np.ndarray, axis: int, op: str) -> np.ndarray:
    """``acc + bias`` with one int32 bias per channel on ``axis`` (empty: no bias)."""
    if bias.size == 0:
        return acc
    if bias.size != acc.shape[axis]:
        raise SimulatorError(f"{op}: {bias.size} biases for {acc.shape[axis]} channels")
    shape = [1] * acc.ndim
    shape[axis] = -1
    return acc + bias.astype(np.int64).reshape(shape)


def qconv(inputs, attrs):
    """``QConv(x, w, bias, mult, shift)``, attrs strides, pads, dilations, group.

    FORMULA: ``acc[n, o] = conv_int(x, w)[n, o] + bias[o]``; ``y = req(acc, mult[o],
    shift[o])`` (one mult/shift may serve all channels); out_dtype int32 with empty
    mult/shift: ``y = clamp(acc, int32)``.
    """
    x, w, bias, mult, shift = _inputs("QConv", inputs, 5)
    geometry = [_attr(attrs, k, "QConv", None) for k in ("strides", "pads", "dilations")]
    acc = conv_int(x, w, *geometry, group=int(_attr(attrs, "group", "QConv", 1)))
    return _requant(_with_bias(acc, bias, 1, "QConv"), mult, shift, attrs, "QConv", 1)


def qlinear(inputs, attrs):
    """``QLinear(x, w, bias, mult, shift)``, w int8 [N, K].

    FORMULA: ``acc[..., j] = sum_k x[..., k] * w[j, k] + bias[j]``;
    ``y = req(acc, mult[j], shift[j])`` (per output feature, last axis).
    """
    x, w, bias, mult, shift = _inputs("QLinear", inputs, 5)
    acc = _with_bias(matmul_int(x, w.T), bias, -1, "QLinear")
    return _requant(acc, mult, shift, attrs, "QLinear", -1)


def qmatmul(inputs, attrs):
    """``QMatMul(a, b, mult, shift)``. FORMULA: ``y = req(a @ b, mult, shift)`` (scalars)."""
    a, b, mult, shift = _inputs("QMatMul", inputs, 4)
    return _requant(matmul_int(a, b), mult, shift, attrs, "QMatMul", None)


def _checked_products(op: str, *pairs) -> None:
    """Raise unless ``sum max|u| * max|v|`` over the pairs stays below 2**62 (no wrap)."""
    if sum(max_abs(u) * max_abs(v) for u, v in pairs) >= PRODUCT_LIMIT:
        raise SimulatorError(f"{op}: products may overflow int64", where=f"qparity.{op}")


def qadd(inputs, attrs):
    """``QAdd(a, b, ma, mb, shift)``: eltwise add with aligned scales (numpy broadcasting).

    FORMULA: ``y = clamp(round_div(a*ma + b*mb, 2**shift))`` = ``req(a*ma + b*mb, 1,
    shift)``; ma/mb may be per-channel arrays shaped to broadcast (e.g. [C, 1, 1]);
    subtraction is a negative ``mb``. See :func:`intmath.aligned_multipliers`.
    """
    a, b, ma, mb, shift = _inputs("QAdd", inputs, 5)
    _checked_products("QAdd", (a, ma), (b, mb))
    i64 = np.int64
    acc = a.astype(i64) * ma.astype(i64) + b.astype(i64) * mb.astype(i64)
    dtype, rounding = _attr(attrs, "out_dtype", "QAdd"), _attr(attrs, "rounding", "QAdd")
    return _finish(requantize(acc, 1, shift, dtype, rounding), attrs, "QAdd")


def qmul(inputs, attrs):
    """``QMul(a, b, mult, shift)``. FORMULA: ``y = req(a * b, mult, shift)`` (broadcasting)."""
    a, b, mult, shift = _inputs("QMul", inputs, 4)
    _checked_products("QMul", (a, b))
    return _requant(a.astype(np.int64) * b.astype(np.int64), mult, shift, attrs, "QMul", None)


def qrequant(inputs, attrs):
    """``QRequant(x, mult, shift)``, attr axis (-1 or absent: one mult/shift for all).

    FORMULA: ``y = req(x, mult[c], shift[c])``, c the index along ``axis``.
    """
    x, mult, shift = _inputs("QRequant", inputs, 3)
    axis = int(_attr(attrs, "axis", "QRequant", -1))
    return _requant(x, mult, shift, attrs, "QRequant", None if axis == -1 else axis)


def _divide(total, n, mult, shift, attrs: dict, op: str) -> np.ndarray:
    """FORMULA: ``clamp(round_div(total * mult, n << shift), qrange(out_dtype))``: one
    exact rounding of ``total * mult / (n * 2**shift)``; every term kept below 2**62."""
    m, s = _scalar(mult, "mult", op), _scalar(shift, "shift", op)
    d = np.asarray(n, dtype=np.int64)
    bad = not 0 <= s <= MAX_SHIFT or (max_abs(d) << s) >= PRODUCT_LIMIT
    if bad or max_abs(total) * abs(m) >= PRODUCT_LIMIT:
        raise SimulatorError(f"{op}: shift {s} / mult {m} overflow int64", where=f"qparity.{op}")
    y = round_div(total * m, d << s, _attr(attrs, "rounding", op))
    return _finish(clamp(y, *fp.qrange(_attr(attrs, "out_dtype", op))), attrs, op)


def qavgpool(inputs, attrs):
    """``QAvgPool(x, mult, shift)``, attrs kernel_shape, strides, pads, count_include_pad.

    FORMULA: ``y = clamp(round_div(sums * mult, counts << shift))`` with zero-padded window
    sums; counts = kernel size if count_include_pad else the real elements per window.
    """
    x, mult, shift = _inputs("QAvgPool", inputs, 3)
    kernel = [int(k) for k in _attr(attrs, "kernel_shape", "QAvgPool")]
    strides, pads = attrs.get("strides"), attrs.get("pads")
    sums, counts = sum_pool_int(x, kernel, strides, pads)
    if int(_attr(attrs, "count_include_pad", "QAvgPool", 0)):
        counts = math.prod(kernel)
    return _divide(sums, counts, mult, shift, attrs, "QAvgPool")


def _reduce(x: np.ndarray, attrs: dict, op: str) -> tuple[np.ndarray, int]:
    """(int64 sum over ``axes`` (absent: all), number of elements summed per output)."""
    axes = attrs.get("axes")
    axes = tuple(range(x.ndim)) if axes is None else tuple(int(a) % x.ndim for a in axes)
    keep = bool(int(_attr(attrs, "keepdims", op, 1)))
    total = x.astype(np.int64).sum(axis=axes, keepdims=keep)
    return total, math.prod(x.shape[a] for a in axes)


def qreducemean(inputs, attrs):
    """``QReduceMean(x, mult, shift)``, attrs axes, keepdims.

    FORMULA: ``y = clamp(round_div(sum(x, axes) * mult, n << shift))``, n reduced elements.
    """
    x, mult, shift = _inputs("QReduceMean", inputs, 3)
    total, n = _reduce(x, attrs, "QReduceMean")
    return _divide(total, n, mult, shift, attrs, "QReduceMean")


def qreducesum(inputs, attrs):
    """``QReduceSum(x, mult, shift)``. FORMULA: ``y = clamp(round_div(sum(x, axes) *
    mult, 2**shift))``."""
    x, mult, shift = _inputs("QReduceSum", inputs, 3)
    total, _ = _reduce(x, attrs, "QReduceSum")
    return _divide(total, 1, mult, shift, attrs, "QReduceSum")


def qmaxpool(inputs, attrs):
    """``QMaxPool(x)``, attrs kernel_shape, strides, pads, dilations; keeps x's dtype.

    FORMULA: ``y[..., p] = max_k x_pad[..., p*stride + k*dilation]``, padding = qmin.
    """
    (x,) = _inputs("QMaxPool", inputs, 1)
    kernel = [int(k) for k in _attr(attrs, "kernel_shape", "QMaxPool")]
    geometry = [attrs.get(k) for k in ("strides", "pads", "dilations")]
    return max_pool_int(x, kernel, *geometry)


def qclip(inputs, attrs):
    """``QClip(x)``, integer attrs lo, hi (relu: lo=0; relu6: hi=round(6/s)); keeps dtype.

    FORMULA: ``y = min(max(x, lo), hi)``.
    """
    (x,) = _inputs("QClip", inputs, 1)
    info = np.iinfo(x.dtype)
    lo = max(int(_attr(attrs, "lo", "QClip")), info.min)
    hi = min(int(_attr(attrs, "hi", "QClip")), info.max)
    return np.clip(x, lo, hi).astype(x.dtype)


INT_OPS = {
    "QConv": qconv,
    "QLinear": qlinear,
    "QMatMul": qmatmul,
    "QAdd": qadd,
    "QMul": qmul,
    "QRequant": qrequant,
    "QAvgPool": qavgpool,
    "QReduceMean": qreducemean,
    "QReduceSum": qreducesum,
    "QMaxPool": qmaxpool,
    "QClip": qclip,
}
"""Op type (domain ``qparity``) -> evaluator; see each function for inputs and formula."""
