"""The executor's pooling and reduction kernels: AVGPOOL, MAXPOOL, REDUCE_MEAN, REDUCE_SUM.

Each ``fn(instr, bufs, consts) -> [tensors]`` is bit-identical to its reference in
:mod:`simulator.arith.int_ops`. Reductions sum exactly in float (:func:`exec_kernels.sum_exact`)
and divide with :func:`exec_epilogue.round_quotient` when ``n max|x| max|mult| < 2**50``,
else in int64 with :func:`simulator.arith.intmath.round_div`. Operand order and layouts:
:mod:`simulator.runtime.executor`.
"""

from __future__ import annotations

import torch

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import MAX_SHIFT, PRODUCT_LIMIT, max_abs, round_div
from simulator.kernels import exec_kernels as ek
from simulator.kernels import exec_native_move, exec_native_rows
from simulator.kernels.exec_epilogue import QUOTIENT_EXACT, dtype_bound, round_quotient
from simulator.kernels.exec_ops import _axis, _finish, is_nhwc, operands


def _divide(total, n, mult, shift, attrs: dict) -> torch.Tensor:
    """``clamp(round_div(total * mult, n << shift))`` (int_ops._divide), same refusals;
    a float64 ``total`` goes through :func:`_divide_float`."""
    if total.is_floating_point():
        return _divide_float(total, n, mult, shift, attrs)
    m, s = int(mult.reshape(())), int(shift.reshape(()))
    d = torch.as_tensor(n, dtype=torch.int64)
    bad = not 0 <= s <= MAX_SHIFT or (max_abs(d) << s) >= PRODUCT_LIMIT
    if bad or max_abs(total) * abs(m) >= PRODUCT_LIMIT:
        raise SimulatorError(f"shift {s} / mult {m} overflow int64")
    y = round_div(total * m, d << s, attrs["rounding"])
    return _finish(y.clamp_(*fp.qrange(attrs["out_dtype"])), attrs)


def _divide_float(total, n: int, mult, shift, attrs: dict) -> torch.Tensor:
    """:func:`_divide` for a float64 integer ``total`` with ``|total * mult| < 2**50``.

    FORMULA: ``round_quotient(total * mult, n * 2**shift)`` (exact:
    :func:`exec_epilogue.round_quotient`; ``total * mult`` is an integer below 2**50 and
    ``n * 2**shift`` an exact float64 integer), then clamp / relu / cast.
    """
    m, s = int(mult.reshape(())), int(shift.reshape(()))
    if not 0 <= s <= MAX_SHIFT:
        raise SimulatorError(f"shift {s} outside [0, {MAX_SHIFT}]")
    y = round_quotient(total.mul_(m), n * 2.0**s, attrs["rounding"])
    return _finish(y.clamp_(*fp.qrange(attrs["out_dtype"])), attrs)


def _pool_axes(instr, x, nd: int) -> tuple[int, ...]:
    return (1, 2) if is_nhwc(instr) else tuple(range(x.ndim - nd, x.ndim))


def k_avgpool(instr, bufs, consts):
    """AVGPOOL = QAvgPool. FORMULA: ``y = clamp(round_div(sums * mult, counts << shift))``."""
    x, mult, shift = operands(instr, bufs, consts, 3)
    a = instr.attrs
    kernel = [int(k) for k in a["kernel_shape"]]
    strides, pads, _ = ek.geometry(len(kernel), {**a, "dilations": None})
    sums, counts = ek.sum_pool(x, _pool_axes(instr, x, len(kernel)), kernel, strides, pads)
    if int(a.get("count_include_pad") or 0):
        counts = ek.numel(kernel)
    return [_divide(sums, counts, mult, shift, a)]


def _reduce_axes(instr, x) -> tuple[tuple[int, ...], bool]:
    """(sorted reduced axes of ``x``, keepdims) from the attributes."""
    axes = instr.attrs.get("axes")
    axes = range(x.ndim) if axes is None else [_axis(instr, int(a), x.ndim) for a in axes]
    axes = tuple(sorted({a % x.ndim for a in axes}))
    if is_nhwc(instr) and x.ndim == 4 and 3 in axes:
        raise SimulatorError("reduction over padded channels", hint="reduce in plain layout")
    return axes, bool(int(instr.attrs.get("keepdims", 1)))


def _reduce(instr, consts, x, mult, axes, keep) -> tuple[torch.Tensor, int]:
    """(sum of ``x`` over ``axes``, elements per output): float64 (exact integers, see
    :func:`_divide_float`) when ``n max|x| max|mult| < 2**50``, else int64."""
    n = ek.numel(x.shape[a] for a in axes)
    m_top = consts.cached(("max_abs", instr.consts[0]), lambda: max_abs(mult))
    wide = n * dtype_bound(x.dtype) * m_top >= QUOTIENT_EXACT
    total = (
        x.sum(dim=axes, keepdim=keep, dtype=torch.int64) if wide else ek.sum_exact(x, axes, keep)
    )
    return total, n


def k_reduce_mean(instr, bufs, consts):
    """REDUCE_MEAN. FORMULA: ``y = clamp(round_div(sum(x) * mult, n << shift))``; over a
    block of adjacent axes in one pass of the compiled row kernel when it applies
    (:func:`exec_native_rows.mean`)."""
    x, mult, shift = operands(instr, bufs, consts, 3)
    axes, keep = _reduce_axes(instr, x)
    fast = exec_native_rows.mean(x, axes, keep, mult, shift, instr.attrs)
    if fast is not None:
        return [fast]
    total, n = _reduce(instr, consts, x, mult, axes, keep)
    return [_divide(total, n, mult, shift, instr.attrs)]


def k_reduce_sum(instr, bufs, consts):
    """REDUCE_SUM. FORMULA: ``y = clamp(round_div(sum(x) * mult, 2**shift))``."""
    x, mult, shift = operands(instr, bufs, consts, 3)
    total, _ = _reduce(instr, consts, x, mult, *_reduce_axes(instr, x))
    return [_divide(total, 1, mult, shift, instr.attrs)]


def k_maxpool(instr, bufs, consts):
    """MAXPOOL = QMaxPool. FORMULA: ``y[p] = max_k x_pad[p*stride + k*dilation]``; nhwc
    buffers in the compiled kernel (:func:`exec_native_move.maxpool`)."""
    (x,) = operands(instr, bufs, consts, 1)
    kernel = [int(k) for k in instr.attrs["kernel_shape"]]
    strides, pads, dil = ek.geometry(len(kernel), instr.attrs)
    if (
        is_nhwc(instr)
        and (fast := exec_native_move.maxpool(x, kernel, strides, pads, dil)) is not None
    ):
        return [fast]  # one compiled pass over the NHWC buffer
    return [ek.max_pool(x, _pool_axes(instr, x, len(kernel)), kernel, strides, pads, dil)]
