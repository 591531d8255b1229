"""The executor's integer arithmetic instruction kernels, plus what every kernel shares.

Holds :class:`ConstPool` (a program's constants as torch tensors, with a cache of derived
objects), :func:`operands` / :func:`is_nhwc` (an instruction's operand list and layout),
and the kernels ``fn(instr, bufs, consts) -> [tensors]`` of CONV, LINEAR, MATMUL, ADD, MUL,
REQUANT and CLIP, each bit-identical to its reference in :mod:`simulator.arith.int_ops` (pools
and reductions: :mod:`simulator.kernels.exec_pool`). Operand order, the nhwc layout and the machine
state are documented in :mod:`simulator.runtime.executor`; the tensor kernels they call are
:mod:`simulator.kernels.exec_kernels`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import PRODUCT_LIMIT, max_abs
from simulator.kernels import exec_depthwise, exec_native, exec_native_move, exec_native_rows
from simulator.kernels import exec_kernels as ek
from simulator.kernels.exec_conv import build_plan, linear_add_plan, run_conv
from simulator.kernels.exec_epilogue import (
    acc_bound,
    add_epilogue,
    dtype_bound,
    gemm_epilogue,
    scaled_epilogue,
)
from simulator.program.isa import Instruction, Op
from simulator.runtime.memo import derived

_NCHW_TO_NHWC = {0: 0, 1: 3, 2: 1, 3: 2}


class ConstPool(dict):
    """Constant name -> torch tensor (converted once), plus ``derived`` objects and the
    program's buffer ``layouts``."""

    def __init__(self, arrays: dict[str, np.ndarray], layouts: dict | None = None):
        super().__init__({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
        self.arrays = arrays
        self.layouts = layouts or {}  # buffer -> simulator.program.isa.Layout (real channel counts)
        self.derived: dict[tuple, object] = {}

    def cached(self, key: tuple, build: Callable[[], object]):
        """``build()`` once per key (decoded tables and other per-program objects)."""
        if key not in self.derived:
            self.derived[key] = build()
        return self.derived[key]


def operands(instr: Instruction, bufs, consts: ConstPool, want: int | None = None) -> list:
    """``[bufs[i] for i in inputs] + [consts[c] for c in consts]`` (``""`` -> None)."""
    ops = [bufs[n] for n in instr.inputs] + [consts[c] if c else None for c in instr.consts]
    if want is not None and len(ops) != want:
        raise SimulatorError(f"{instr.op} takes {want} operands, got {len(ops)}",
                             hint="inputs (buffers) then consts, in quantized.onnx order")  # fmt: skip
    return ops


def is_nhwc(instr: Instruction) -> bool:
    """True when the instruction's 4-D buffers are ``[N, H, W, C_pad]``."""
    return instr.attrs.get("layout") == "nhwc"


def _empty(t) -> bool:
    return t is None or t.numel() == 0


def _finish(y: torch.Tensor, attrs: dict) -> torch.Tensor:
    """``max(y, 0)`` if ``relu``, clamped to ``clip`` when set (a fused QClip), then cast
    to ``out_dtype`` (y already saturated)."""
    if int(attrs.get("relu") or 0):
        y = y.clamp_(min=0)
    if attrs.get("clip") is not None:
        y = y.clamp_(*(int(v) for v in attrs["clip"]))
    return y.to(ek.TORCH_DTYPES[attrs["out_dtype"]])


def _req(acc, mult, shift, attrs: dict, axis: int | None) -> torch.Tensor:
    """``req(acc, mult, shift)`` (int_ops._requant): empty mult/shift -> int32 saturate."""
    if _empty(mult) or _empty(shift):
        if attrs["out_dtype"] != "int32":
            raise SimulatorError(f"no mult/shift but out_dtype {attrs['out_dtype']}")
        return _finish(acc.long().clamp(*fp.qrange("int32")), attrs)
    return _finish(ek.requant(acc, mult, shift, attrs["out_dtype"], attrs["rounding"], axis),
                   attrs)  # fmt: skip


def _bias(acc: torch.Tensor, bias) -> torch.Tensor:
    """``acc + bias[c]`` along the last axis, int64 (empty bias: unchanged)."""
    if _empty(bias):
        return acc
    if bias.numel() != acc.shape[-1]:
        raise SimulatorError(f"{bias.numel()} biases for {acc.shape[-1]} channels")
    return acc.long() + bias.long()


def k_conv(instr, bufs, consts):
    """CONV = QConv (+ a fused QAdd when it has two inputs, :mod:`simulator.kernels.exec_conv`).

    FORMULA: ``y = req(conv_int(x, w) + bias[o], mult[o], shift[o])``. nhwc group-1 convs
    whose float64 epilogue is proven exact run blocked in :func:`exec_conv.run_conv`;
    the rest here, channels-last, ``group`` > 1 via block-diagonal weights."""
    x = bufs[instr.inputs[0]]
    b = bufs[instr.inputs[1]] if len(instr.inputs) > 1 else None
    if is_nhwc(instr) and x.ndim == 4 and int(instr.attrs.get("group") or 1) == 1:
        b_dtype = None if b is None else b.dtype
        plan = consts.cached(("conv_plan", instr.outputs[0], x.dtype, b_dtype),
                             lambda: build_plan(instr, consts, x.dtype, b_dtype))  # fmt: skip
        if plan is not None:
            return [run_conv(plan, x, b)]
    if x.ndim == 4 and b is None and int(instr.attrs.get("group") or 1) > 1:
        y = exec_depthwise.conv(instr, x, consts)
        if y is not None:
            return [y]
    if b is None:
        return [_conv_int(instr, bufs, consts)]
    conv = Instruction(instr.op, instr.inputs[:1], ("acc",), instr.consts[:4],
                       {**instr.attrs, "out_dtype": "int32", "relu": 0})  # fmt: skip
    add = Instruction(instr.op, ("acc", instr.inputs[1]), instr.outputs, instr.consts[4:7],
                      instr.attrs)  # fmt: skip
    return k_add(add, {"acc": _conv_int(conv, bufs, consts), instr.inputs[1]: b}, consts)


def _conv_int(instr, bufs, consts) -> torch.Tensor:
    """QConv with the int64 requantize; plain NCHW input is viewed as NHWC."""
    x, w, bias, mult, shift = operands(instr, bufs, consts, 5)
    nhwc, one_d = is_nhwc(instr), x.ndim == 3
    strides, pads, dil = ek.geometry(x.ndim - 2, instr.attrs)
    if one_d:  # 1-D conv as 2-D with H = 1
        x, w = x.unsqueeze(2), w.unsqueeze(2)
        strides, pads, dil = [1, *strides], [0, pads[0], 0, pads[1]], [1, *dil]
    if not nhwc:
        x, w = x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)
    group = int(instr.attrs.get("group") or 1)
    wmat = consts.cached(("conv", instr.consts[0], nhwc), lambda: ek.pack_conv(w, group))
    acc = ek.conv_nhwc(x, wmat, w.shape[1:3], strides, pads, dil)
    y = _req(_bias(acc, bias), mult, shift, instr.attrs, -1)
    if not nhwc:
        y = y.permute(0, 3, 1, 2)
    return y.squeeze(2) if one_d else y


def k_linear(instr, bufs, consts):
    """LINEAR = QLinear. FORMULA: ``y = req(x @ w.T + bias[j], mult[j], shift[j])``; the
    epilogue in float64 when :func:`exec_epilogue.gemm_epilogue` proves it exact. Two
    inputs: + a fused QAdd, as CONV's (:func:`_linear_add`)."""
    if len(instr.inputs) == 2:
        return [_linear_add(instr, bufs, consts)]
    x, w, bias, mult, shift = operands(instr, bufs, consts, 5)
    wt = consts.cached(("linear", instr.consts[0]), lambda: w.t().contiguous())
    key = ("linear", instr.outputs[0], x.dtype)
    epi = consts.cached(key, lambda: gemm_epilogue(instr.attrs, wt, x.dtype, bias, mult, shift))
    if epi is not None:
        nc = consts.cached(
            ("linear_native", *key), lambda: _native_linear(wt, x.dtype, epi, bias, mult)
        )
        if nc is not None:
            return [exec_native.linear(nc, x)]
    acc = ek.matmul_int(x, wt, as_float=epi is not None)
    if epi is not None:
        return [epi.apply(acc)]
    return [_req(_bias(acc, bias), mult, shift, instr.attrs, -1)]


def _linear_add(instr, bufs, consts) -> torch.Tensor:
    """LINEAR ``x, b -> y`` (consts ``w, bias, mult, shift, ma, mb, add_shift``). FORMULA:
    ``y = clamp(round_div(a*ma + b*mb, 2**add_shift))`` with ``a = sat_int32(x @ w.T +
    bias)``: one pass of the compiled kernel when :func:`exec_conv.linear_add_plan`
    proves it exact, else the linear's int32 output, then the add."""
    x, b = (bufs[n] for n in instr.inputs)
    key = ("linear_add", instr.outputs[0], x.dtype, b.dtype)
    nc = consts.cached(key, lambda: linear_add_plan(instr, consts, x.dtype, b.dtype))
    if nc is not None and tuple(b.shape) == (*x.shape[:-1], nc.out_channels):
        return exec_native.linear(nc, x, b)
    acc = f"{instr.outputs[0]}#acc"  # its own name: k_linear caches by output name
    lin = Instruction(Op.LINEAR, instr.inputs[:1], (acc,), instr.consts[:4],
                      {**instr.attrs, "out_dtype": "int32", "relu": 0})  # fmt: skip
    add = Instruction(Op.ADD, (acc, instr.inputs[1]), instr.outputs, instr.consts[4:7],
                      instr.attrs)  # fmt: skip
    return k_add(add, {acc: k_linear(lin, bufs, consts)[0], instr.inputs[1]: b}, consts)[0]


def _native_linear(wt, in_dtype, epi, bias, mult):
    """QLinear's :class:`exec_native.NativeConv` (a 1x1 conv), or None.

    FORMULA of the bounds: ``A = acc_bound(wt, in_dtype, bias)``, ``T = A * max|mult|``."""
    if in_dtype not in exec_native.IN_DTYPES:
        return None
    a = acc_bound(wt, in_dtype, bias)
    top = a * max(max_abs(mult), 1)
    return exec_native.plan(wt, (1, 1), wt.shape[0], in_dtype, epi, bias, None, a, top)


def k_matmul(instr, bufs, consts):
    """MATMUL = QMatMul. FORMULA: ``y = req(a @ b, mult, shift)`` (scalars); batched data
    operands in the compiled row kernel when it applies (:func:`exec_native_rows.bmm`)."""
    a, b, mult, shift = operands(instr, bufs, consts, 4)
    bound = dtype_bound(a.dtype) * dtype_bound(b.dtype) * a.shape[-1]
    key = ("matmul", instr.outputs[0], a.dtype, b.dtype, a.shape[-1])
    epi = consts.cached(key, lambda: scaled_epilogue(instr.attrs, bound, mult, shift, _scalar))
    fast = exec_native_rows.bmm(a, b, epi, instr.attrs)
    if fast is not None:
        return [fast]
    acc = ek.matmul_int(a, b, as_float=epi is not None)
    return [epi.apply(acc) if epi is not None else _req(acc, mult, shift, instr.attrs, None)]


def _scalar(v: torch.Tensor) -> tuple[int, ...]:
    """A constant broadcast as given (one value: a scalar), as ``ek.requant(axis=None)``."""
    return () if v.numel() == 1 else tuple(v.shape)


def _channel_const(v, instr) -> torch.Tensor:
    """A per-channel constant: nhwc flattens it onto the last axis; int64 (once per
    constant)."""
    flat = is_nhwc(instr) and v.numel() > 1
    return derived(v, ("channel", flat), lambda: v.long().reshape(-1) if flat else v.long())


def k_add(instr, bufs, consts):
    """ADD = QAdd. FORMULA: ``y = clamp(round_div(a*ma + b*mb, 2**shift))``; in float
    (:func:`exec_epilogue.add_epilogue`) when the dtype bounds prove it exact, in one pass
    of the compiled row kernel when it applies (:func:`exec_native_rows.add`)."""
    a, b, ma, mb, shift = operands(instr, bufs, consts, 5)
    ma, mb = _channel_const(ma, instr), _channel_const(mb, instr)
    key = ("add", instr.outputs[0], a.dtype, b.dtype)
    epi = consts.cached(key, lambda: add_epilogue(instr.attrs, a.dtype, b.dtype, ma, mb, shift))
    # the compiled kernel reads a constant broadcast over leading axes as it is (expanded,
    # it would be a copy per run, and a per-run copy is never replayed or frozen)
    if epi is not None and (fast := exec_native_rows.add(a, b, epi, instr.attrs)) is not None:
        return [fast]
    if a.shape != b.shape:  # a broadcast operand (either side): the sum has the full shape
        shape = torch.broadcast_shapes(a.shape, b.shape)
        a, b = a.expand(shape), b.expand(shape)
    if epi is not None:
        return [epi.apply(a, b)]
    if max_abs(a) * max_abs(ma) + max_abs(b) * max_abs(mb) >= PRODUCT_LIMIT:
        raise SimulatorError("QAdd products may overflow int64")
    acc = a.long() * ma + b.long() * mb
    y = ek.requant(acc, None, shift, instr.attrs["out_dtype"], instr.attrs["rounding"], None)
    return [_finish(y, instr.attrs)]


def k_mul(instr, bufs, consts):
    """MUL = QMul. FORMULA: ``y = req(a * b, mult, shift)`` (broadcasting); the product and
    requantize in float when ``max|a| max|b| max|mult|`` is below ``exact_limit`` (dtype
    bounds; float32 below its limit, :func:`exec_epilogue.scaled_epilogue`), in the
    compiled row kernel for same-shape or per-row operands (:func:`exec_native_rows.mul`)."""
    a, b, mult, shift = operands(instr, bufs, consts, 4)
    fast = exec_native_rows.mul(a, b, mult, shift, instr.attrs)
    if fast is not None:
        return [fast]
    bound = dtype_bound(a.dtype) * dtype_bound(b.dtype)
    key = ("mul", instr.outputs[0], a.dtype, b.dtype)
    epi = consts.cached(key, lambda: scaled_epilogue(instr.attrs, bound, mult, shift, _scalar))
    if epi is not None:
        return [epi.apply(torch.mul(a.to(epi.ftype), b.to(epi.ftype)))]  # one dtype per op
    if max_abs(a) * max_abs(b) >= PRODUCT_LIMIT:
        raise SimulatorError("QMul products may overflow int64")
    return [_req(a.long() * b.long(), mult, shift, instr.attrs, None)]


def _axis(instr, axis: int, ndim: int) -> int:
    """An NCHW axis attribute as an axis of this instruction's buffers."""
    return _NCHW_TO_NHWC[axis % 4] if is_nhwc(instr) and ndim == 4 else axis


def k_requant(instr, bufs, consts):
    """REQUANT = QRequant. FORMULA: ``y = req(x, mult[c], shift[c])`` along ``axis``; in the
    compiled QAdd kernel when the scale is a scalar or runs along the last axis
    (:func:`exec_native_rows.requant`)."""
    x, mult, shift = operands(instr, bufs, consts, 3)
    axis = int(instr.attrs.get("axis", -1))
    axis = None if axis == -1 else _axis(instr, axis, x.ndim)
    key = ("requant", instr.outputs[0], x.dtype, x.ndim)
    epi = consts.cached(key, lambda: scaled_epilogue(instr.attrs, dtype_bound(x.dtype), mult,
                                                     shift, _shaper(x, axis)))  # fmt: skip
    if (fast := exec_native_rows.requant(x, epi, instr.attrs)) is not None:
        return [fast]  # one compiled pass
    return [epi.apply(x) if epi is not None else _req(x, mult, shift, instr.attrs, axis)]


def _shaper(x: torch.Tensor, axis: int | None) -> Callable:
    """Shape of a scalar or per-channel constant along ``axis`` of x (as ek.requant)."""
    return lambda v: tuple(ek._along(v, x, axis, "mult").shape)


def k_clip(instr, bufs, consts):
    """CLIP = QClip. FORMULA: ``y = min(max(x, lo), hi)``, bounds cut to x's dtype."""
    (x,) = operands(instr, bufs, consts, 1)
    info = torch.iinfo(x.dtype)
    lo, hi = max(int(instr.attrs["lo"]), info.min), min(int(instr.attrs["hi"]), info.max)
    y = exec_native_move.clip(x, lo, hi) if lo <= hi else None
    return [x.clamp(lo, hi) if y is None else y]
