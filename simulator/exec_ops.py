"""The executor's integer arithmetic instruction kernels, plus what every kernel shares.

Holds :class:`ConstPool` (a program's constants as torch tensors, with a cache of derived
objects), :func:`operands` / :func:`is_nhwc` (an instruction's operand list and layout),
and the kernels ``fn(instr, bufs, consts) -> [tensors]`` of CONV, LINEAR, MATMUL, ADD, MUL,
REQUANT, AVGPOOL, REDUCE_MEAN, REDUCE_SUM, MAXPOOL and CLIP, each bit-identical to its
reference in :mod:`simulator.int_ops`. Operand order, the nhwc layout and the machine
state are documented in :mod:`simulator.executor`; the tensor kernels they call are
:mod:`simulator.exec_kernels`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from schemas.errors import SimulatorError
from simulator import exec_kernels as ek
from simulator import fixedpoint as fp
from simulator.intmath import MAX_SHIFT, PRODUCT_LIMIT, max_abs, round_div
from simulator.isa import Instruction

_NCHW_TO_NHWC = {0: 0, 1: 3, 2: 1, 3: 2}


class ConstPool(dict):
    """Constant name -> torch tensor (converted once), plus ``derived`` objects."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        super().__init__({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
        self.arrays = arrays
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
    """``max(y, 0)`` if ``relu``, then cast to ``out_dtype`` (y already saturated)."""
    if int(attrs.get("relu") or 0):
        y = y.clamp_(min=0)
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
    """CONV = QConv. FORMULA: ``y = req(conv_int(x, w) + bias[o], mult[o], shift[o])``;
    computed channels-last (plain NCHW input is viewed as NHWC, the output viewed back);
    ``group`` > 1 via the block-diagonal weights of :func:`exec_kernels.pack_conv`."""
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
    return [y.squeeze(2) if one_d else y]


def k_linear(instr, bufs, consts):
    """LINEAR = QLinear. FORMULA: ``y = req(x @ w.T + bias[j], mult[j], shift[j])``."""
    x, w, bias, mult, shift = operands(instr, bufs, consts, 5)
    wt = consts.cached(("linear", instr.consts[0]), lambda: w.t().contiguous())
    acc = ek.matmul_int(x, wt)
    return [_req(_bias(acc, bias), mult, shift, instr.attrs, -1)]


def k_matmul(instr, bufs, consts):
    """MATMUL = QMatMul. FORMULA: ``y = req(a @ b, mult, shift)`` (scalars)."""
    a, b, mult, shift = operands(instr, bufs, consts, 4)
    return [_req(ek.matmul_int(a, b), mult, shift, instr.attrs, None)]


def _channel_const(v, instr) -> torch.Tensor:
    """A per-channel constant: nhwc flattens it onto the last axis; int64."""
    v = v.long()
    return v.reshape(-1) if is_nhwc(instr) and v.numel() > 1 else v


def k_add(instr, bufs, consts):
    """ADD = QAdd. FORMULA: ``y = clamp(round_div(a*ma + b*mb, 2**shift))``."""
    a, b, ma, mb, shift = operands(instr, bufs, consts, 5)
    ma, mb = _channel_const(ma, instr), _channel_const(mb, instr)
    if max_abs(a) * max_abs(ma) + max_abs(b) * max_abs(mb) >= PRODUCT_LIMIT:
        raise SimulatorError("QAdd products may overflow int64")
    acc = a.long() * ma + b.long() * mb
    y = ek.requant(acc, None, shift, instr.attrs["out_dtype"], instr.attrs["rounding"], None)
    return [_finish(y, instr.attrs)]


def k_mul(instr, bufs, consts):
    """MUL = QMul. FORMULA: ``y = req(a * b, mult, shift)`` (broadcasting)."""
    a, b, mult, shift = operands(instr, bufs, consts, 4)
    if max_abs(a) * max_abs(b) >= PRODUCT_LIMIT:
        raise SimulatorError("QMul products may overflow int64")
    return [_req(a.long() * b.long(), mult, shift, instr.attrs, None)]


def _axis(instr, axis: int, ndim: int) -> int:
    """An NCHW axis attribute as an axis of this instruction's buffers."""
    return _NCHW_TO_NHWC[axis % 4] if is_nhwc(instr) and ndim == 4 else axis


def k_requant(instr, bufs, consts):
    """REQUANT = QRequant. FORMULA: ``y = req(x, mult[c], shift[c])`` along ``axis``."""
    x, mult, shift = operands(instr, bufs, consts, 3)
    axis = int(instr.attrs.get("axis", -1))
    return [_req(x, mult, shift, instr.attrs, None if axis == -1 else _axis(instr, axis, x.ndim))]


def _divide(total, n, mult, shift, attrs: dict) -> torch.Tensor:
    """``clamp(round_div(total * mult, n << shift))`` (int_ops._divide), same refusals."""
    m, s = int(mult.reshape(())), int(shift.reshape(()))
    d = torch.as_tensor(n, dtype=torch.int64)
    bad = not 0 <= s <= MAX_SHIFT or (max_abs(d) << s) >= PRODUCT_LIMIT
    if bad or max_abs(total) * abs(m) >= PRODUCT_LIMIT:
        raise SimulatorError(f"shift {s} / mult {m} overflow int64")
    y = round_div(total * m, d << s, attrs["rounding"])
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


def _reduce(instr, bufs, consts) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]:
    """(int64 sum over ``axes``, elements per output, mult, shift)."""
    x, mult, shift = operands(instr, bufs, consts, 3)
    axes = instr.attrs.get("axes")
    axes = range(x.ndim) if axes is None else [_axis(instr, int(a), x.ndim) for a in axes]
    axes = tuple(sorted({a % x.ndim for a in axes}))
    if is_nhwc(instr) and x.ndim == 4 and 3 in axes:
        raise SimulatorError("reduction over padded channels", hint="reduce in plain layout")
    total = x.long().sum(dim=axes, keepdim=bool(int(instr.attrs.get("keepdims", 1))))
    return total, ek.numel(x.shape[a] for a in axes), mult, shift


def k_reduce_mean(instr, bufs, consts):
    """REDUCE_MEAN. FORMULA: ``y = clamp(round_div(sum(x) * mult, n << shift))``."""
    total, n, mult, shift = _reduce(instr, bufs, consts)
    return [_divide(total, n, mult, shift, instr.attrs)]


def k_reduce_sum(instr, bufs, consts):
    """REDUCE_SUM. FORMULA: ``y = clamp(round_div(sum(x) * mult, 2**shift))``."""
    total, _, mult, shift = _reduce(instr, bufs, consts)
    return [_divide(total, 1, mult, shift, instr.attrs)]


def k_maxpool(instr, bufs, consts):
    """MAXPOOL = QMaxPool. FORMULA: ``y[p] = max_k x_pad[p*stride + k*dilation]``."""
    (x,) = operands(instr, bufs, consts, 1)
    kernel = [int(k) for k in instr.attrs["kernel_shape"]]
    strides, pads, dil = ek.geometry(len(kernel), instr.attrs)
    return [ek.max_pool(x, _pool_axes(instr, x, len(kernel)), kernel, strides, pads, dil)]


def k_clip(instr, bufs, consts):
    """CLIP = QClip. FORMULA: ``y = min(max(x, lo), hi)``, bounds cut to x's dtype."""
    (x,) = operands(instr, bufs, consts, 1)
    info = torch.iinfo(x.dtype)
    lo, hi = max(int(instr.attrs["lo"]), info.min), min(int(instr.attrs["hi"]), info.max)
    return [x.clamp(lo, hi)]
