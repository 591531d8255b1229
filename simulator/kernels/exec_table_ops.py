"""The executor's table-driven and float-side instruction kernels.

Holds the kernels ``fn(instr, bufs, consts) -> [tensors]`` of LUT, SOFTMAX and LAYERNORM
(the table, decoded once from the instruction's attrs and constants by
:func:`simulator.arith.custom_ops.decode`, then evaluated through its dense form,
:mod:`simulator.kernels.exec_dense`), QUANTIZE, DEQUANTIZE and PREPROCESS (the board camera
input); CPU islands are :mod:`simulator.kernels.exec_cpu`. The machine state is documented in
:mod:`simulator.runtime.executor`.
"""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import torch

from schemas.errors import SimulatorError
from simulator.arith import composite
from simulator.arith import fixedpoint as fp
from simulator.arith.composite import LayerNormTables, SoftmaxTables
from simulator.arith.custom_ops import decode
from simulator.arith.lut import LutTable
from simulator.kernels import exec_kernels as ek
from simulator.kernels import exec_native_norm, exec_native_rows
from simulator.kernels.exec_dense import (
    Dense,
    dense,
    exp_of_gap,
    int_layernorm,
    int_softmax,
    ln_affine,
)
from simulator.kernels.exec_ops import ConstPool
from simulator.runtime.memo import derived


def _table(instr, consts: ConstPool, cls):
    """The instruction's table object, decoded once from its constants."""
    build = lambda: decode(cls, instr.attrs, [consts.arrays[c] for c in instr.consts])  # noqa: E731
    return consts.cached((cls.__name__, instr.consts), build)


def _dense(instr, consts, table: LutTable, name: str, dtype: torch.dtype) -> Dense:
    """The dense form of one of the instruction's tables, built once per program."""
    return consts.cached(("dense", name, instr.consts, dtype), lambda: dense(table, dtype))


def k_lut(instr, bufs, consts):
    """LUT. FORMULA: :func:`simulator.arith.lut.lookup` on the decoded table, as one gather of
    its dense form (:mod:`simulator.kernels.exec_dense`)."""
    table = _table(instr, consts, LutTable)
    lut = _dense(instr, consts, table, "lut", ek.TORCH_DTYPES[table.out_dtype])
    return [lut(bufs[instr.inputs[0]])]


def k_softmax(instr, bufs, consts):
    """SOFTMAX. FORMULA: :func:`simulator.arith.composite.int_softmax` along ``axis``
    (:func:`simulator.kernels.exec_dense.int_softmax`: gap-indexed exp, dense reciprocal; on the
    last axis in the compiled kernel, :func:`simulator.kernels.exec_native_norm.softmax`)."""
    t = _table(instr, consts, SoftmaxTables)
    q = bufs[instr.inputs[0]]
    exp = consts.cached(("exp_gap", instr.consts, q.dtype), lambda: exp_of_gap(t, q.dtype))
    recip = _dense(instr, consts, t.recip, "recip", torch.float64)
    axis = int(instr.attrs["axis"])
    if (y := exec_native_norm.softmax(q, axis, t, exp, recip)) is not None:
        return [y]  # one compiled pass per row
    return [int_softmax(q, axis, t, exp, recip).to(ek.TORCH_DTYPES[t.out_dtype])]


def k_layernorm(instr, bufs, consts):
    """LAYERNORM. FORMULA: :func:`simulator.arith.composite.int_layernorm` on the last axis
    (:func:`simulator.kernels.exec_dense.int_layernorm`: dense rsqrt table; in one compiled pass
    when :func:`simulator.kernels.exec_native_norm.layernorm` applies)."""
    t = _table(instr, consts, LayerNormTables)
    rsqrt = _dense(instr, consts, t.rsqrt, "rsqrt", torch.float64)
    x = bufs[instr.inputs[0]]
    affine = consts.cached(("ln_affine", instr.consts), lambda: ln_affine(t))
    y = exec_native_norm.layernorm(x, t, rsqrt, affine)  # compiled, when it applies
    y = int_layernorm(x, t, rsqrt, affine) if y is None else y
    y = composite.int_layernorm(x, t) if y is None else y  # a bound failed: the reference
    return [y.to(ek.TORCH_DTYPES[t.out_dtype])]


def _scale(instr, consts, x: torch.Tensor) -> tuple[torch.Tensor, int | None]:
    """(scale tensor, channel axis or None) from ``attrs["scale"]`` or the first const;
    once per instruction and input rank."""

    def build():
        s = instr.attrs.get("scale")
        s = consts[instr.consts[0]] if s is None else torch.as_tensor(s, dtype=torch.float64)
        s = s.reshape(-1)
        return s, (None if s.numel() == 1 else int(instr.attrs.get("axis", 1)) % x.ndim)

    return consts.cached(("scale", instr.outputs[0], x.ndim), build)


def k_quantize(instr, bufs, consts):
    """QUANTIZE. FORMULA: ``clamp(round_by(x / scale), qrange(dtype))`` in x's float dtype
    (the scale cast to it first, as :func:`simulator.arith.fixedpoint.quantize`); int8 / int16
    bounds are exact floats, so the clamped value casts directly; NaN gives qmin, as
    :func:`simulator.arith.fixedpoint.quantize`."""
    x = bufs[instr.inputs[0]]
    s, axis = _scale(instr, consts, x)
    dtype = instr.attrs.get("dtype", "int8")
    mode = instr.attrs.get("rounding", "bpu_round")
    if dtype == "int32" or not x.is_floating_point():
        return [fp.quantize(x, s, dtype, mode, axis).to(ek.TORCH_DTYPES[dtype])]
    if (fast := exec_native_rows.quantize(x, s, axis, dtype, mode)) is not None:
        return [fast]  # one compiled pass, same float operations
    s = s.to(x.dtype).reshape(
        [-1 if i == axis else 1 for i in range(x.ndim)] if axis is not None else ()
    )
    q = fp.round_by(x / s, mode) if mode != "half_even" else (x / s).round_()
    lo, hi = fp.qrange(dtype)
    return [q.nan_to_num_(nan=lo).clamp_(lo, hi).to(ek.TORCH_DTYPES[dtype])]


def k_dequantize(instr, bufs, consts):
    """DEQUANTIZE. FORMULA: ``y = float32(q) * float32(scale[c])`` (ONNX DequantizeLinear)."""
    q = bufs[instr.inputs[0]]
    s, axis = _scale(instr, consts, q)
    if (fast := exec_native_rows.dequantize(q, s, axis)) is not None:
        return [fast]  # one compiled pass, the same float32 product
    shape = [-1 if i == axis else 1 for i in range(q.ndim)] if axis is not None else ()
    s = derived(s, ("dequantize", q.ndim), lambda: s.float().reshape(shape))
    return [q.float() * s]


def k_preprocess(instr, bufs, consts):
    """PREPROCESS: board camera input -> int featuremap via ``simulator.arith.board_input``."""
    if importlib.util.find_spec("simulator.arith.board_input") is None:
        raise SimulatorError("PREPROCESS needs simulator.arith.board_input",
                             hint="feed a featuremap input or install the board input module")  # fmt: skip
    board_input = importlib.import_module("simulator.arith.board_input")
    frames = [bufs[n].numpy() for n in instr.inputs]  # nv12: (y, uv); else one frame
    x = frames[0] if len(frames) == 1 else tuple(frames)
    return [torch.from_numpy(np.ascontiguousarray(board_input.preprocess(x, instr.attrs)))]
