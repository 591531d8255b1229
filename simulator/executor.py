"""The vectorized executor of a :class:`~simulator.isa.Program`: whole-tensor torch kernels,
bit-identical to the reference evaluators (:mod:`simulator.int_ops`, :mod:`simulator.lut`,
:mod:`simulator.composite`, :data:`simulator.custom_ops.CUSTOM_OPS`).

Machine state:

- ``bufs``: buffer name -> torch tensor; int8/int16/int32 (int64 inside kernels only),
  float32 for a QUANTIZE input, a DEQUANTIZE or CPU output. Filled with the program inputs,
  then each instruction writes its ``outputs``; nothing is mutated in place, so a buffer
  may be a view (a transpose, a permuted conv output) of another.
- ``consts``: a :class:`ConstPool` built once per Executor: the program's constants as
  torch tensors, plus derived objects decoded once (LUT / softmax / layernorm tables).
- :data:`KERNELS`: the one table ``Op -> fn(instr, bufs, consts) -> [tensors]``.

Operands: an instruction's operand list is ``inputs`` (buffers) followed by ``consts``
(constant names, ``""`` for an absent optional one): exactly the quantized.onnx node's
inputs when its data inputs come first. ``attrs`` are the node's attributes.

Layouts: ``attrs["layout"] == "nhwc"`` on CONV/ADD/REQUANT/CLIP/MAXPOOL/AVGPOOL/LUT means
its 4-D buffers are ``[N, H, W, C_pad]``; channels ``C..C_pad`` hold zeros. Conv weights
are then packed ``[O_pad, kh, kw, C_in_pad / group]`` int8 (plain: ONNX ``[O, C/g, kh,
kw]``); per-channel bias/mult/shift (and QAdd's ma/mb, flattened) run along the last axis,
padded with 0 (mult 0 keeps padding channels at 0). Axis attributes (REQUANT ``axis``)
keep their NCHW meaning and are mapped to NHWC. Conv with group > 1 is never padded.
After LUT and CLIP (which may map 0 to non-zero) the executor re-zeros padding channels
of an nhwc output whose :class:`~simulator.isa.Layout` says ``channels < channels_padded``.
Captures and outputs are converted back to NCHW with padding dropped.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable
from dataclasses import fields

import numpy as np
import torch

from schemas.errors import QparityError, SimulatorError
from simulator import exec_kernels as ek
from simulator import fixedpoint as fp
from simulator.composite import LayerNormTables, SoftmaxTables, int_layernorm, int_softmax
from simulator.isa import Instruction, Op, Program
from simulator.lut import ARRAY_FIELDS, LutTable, from_arrays, lookup

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


def decode(cls, attrs: dict, arrays: list[np.ndarray], prefix: str = ""):
    """Rebuild a table dataclass from node attrs + initializers (custom_ops field order).

    LutTable: scalars from ``attrs[prefix + field]``, then entries, bounds, mults, shifts;
    SoftmaxTables / LayerNormTables: fields in declaration order, nested tables under
    ``<field>_``, arrays consumed in order.
    """
    if cls is LutTable:
        d = {f.name: attrs[prefix + f.name] for f in fields(LutTable) if f.name not in ARRAY_FIELDS}
        d.update({name: arrays.pop(0) for name in ARRAY_FIELDS})
        return from_arrays(d)
    kw = {}
    for f in fields(cls):
        if f.type == "LutTable":
            kw[f.name] = decode(LutTable, attrs, arrays, f"{prefix}{f.name}_")
        elif f.type == "np.ndarray":
            kw[f.name] = np.asarray(arrays.pop(0), dtype=np.int64)
        else:
            kw[f.name] = attrs[prefix + f.name]
    return cls(**kw)


def _operands(instr: Instruction, bufs, consts: ConstPool, want: int | None = None) -> list:
    """``[bufs[i] for i in inputs] + [consts[c] for c in consts]`` (``""`` -> None)."""
    ops = [bufs[n] for n in instr.inputs] + [consts[c] if c else None for c in instr.consts]
    if want is not None and len(ops) != want:
        raise SimulatorError(f"{instr.op} takes {want} operands, got {len(ops)}",
                             hint="inputs (buffers) then consts, in quantized.onnx order")  # fmt: skip
    return ops


def _nhwc(instr: Instruction) -> bool:
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
    x, w, bias, mult, shift = _operands(instr, bufs, consts, 5)
    nhwc, one_d = _nhwc(instr), x.ndim == 3
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
    x, w, bias, mult, shift = _operands(instr, bufs, consts, 5)
    wt = consts.cached(("linear", instr.consts[0]), lambda: w.t().contiguous())
    acc = ek.matmul_int(x, wt)
    return [_req(_bias(acc, bias), mult, shift, instr.attrs, -1)]


def k_matmul(instr, bufs, consts):
    """MATMUL = QMatMul. FORMULA: ``y = req(a @ b, mult, shift)`` (scalars)."""
    a, b, mult, shift = _operands(instr, bufs, consts, 4)
    return [_req(ek.matmul_int(a, b), mult, shift, instr.attrs, None)]


def _channel_const(v, instr) -> torch.Tensor:
    """A per-channel constant: nhwc flattens it onto the last axis; int64."""
    v = v.long()
    return v.reshape(-1) if _nhwc(instr) and v.numel() > 1 else v


def k_add(instr, bufs, consts):
    """ADD = QAdd. FORMULA: ``y = clamp(round_div(a*ma + b*mb, 2**shift))``."""
    a, b, ma, mb, shift = _operands(instr, bufs, consts, 5)
    ma, mb = _channel_const(ma, instr), _channel_const(mb, instr)
    if fp.max_abs(a) * fp.max_abs(ma) + fp.max_abs(b) * fp.max_abs(mb) >= fp.PRODUCT_LIMIT:
        raise SimulatorError("QAdd products may overflow int64")
    acc = a.long() * ma + b.long() * mb
    y = ek.requant(acc, None, shift, instr.attrs["out_dtype"], instr.attrs["rounding"], None)
    return [_finish(y, instr.attrs)]


def k_mul(instr, bufs, consts):
    """MUL = QMul. FORMULA: ``y = req(a * b, mult, shift)`` (broadcasting)."""
    a, b, mult, shift = _operands(instr, bufs, consts, 4)
    if fp.max_abs(a) * fp.max_abs(b) >= fp.PRODUCT_LIMIT:
        raise SimulatorError("QMul products may overflow int64")
    return [_req(a.long() * b.long(), mult, shift, instr.attrs, None)]


def _axis(instr, axis: int, ndim: int) -> int:
    """An NCHW axis attribute as an axis of this instruction's buffers."""
    return _NCHW_TO_NHWC[axis % 4] if _nhwc(instr) and ndim == 4 else axis


def k_requant(instr, bufs, consts):
    """REQUANT = QRequant. FORMULA: ``y = req(x, mult[c], shift[c])`` along ``axis``."""
    x, mult, shift = _operands(instr, bufs, consts, 3)
    axis = int(instr.attrs.get("axis", -1))
    return [_req(x, mult, shift, instr.attrs, None if axis == -1 else _axis(instr, axis, x.ndim))]


def _divide(total, n, mult, shift, attrs: dict) -> torch.Tensor:
    """``clamp(round_div(total * mult, n << shift))`` (int_ops._divide), same refusals."""
    m, s = int(mult.reshape(())), int(shift.reshape(()))
    d = torch.as_tensor(n, dtype=torch.int64)
    bad = not 0 <= s <= fp.MAX_SHIFT or (fp.max_abs(d) << s) >= fp.PRODUCT_LIMIT
    if bad or fp.max_abs(total) * abs(m) >= fp.PRODUCT_LIMIT:
        raise SimulatorError(f"shift {s} / mult {m} overflow int64")
    y = fp.round_div(total * m, d << s, attrs["rounding"])
    return _finish(y.clamp_(*fp.qrange(attrs["out_dtype"])), attrs)


def _pool_axes(instr, x, nd: int) -> tuple[int, ...]:
    return (1, 2) if _nhwc(instr) else tuple(range(x.ndim - nd, x.ndim))


def k_avgpool(instr, bufs, consts):
    """AVGPOOL = QAvgPool. FORMULA: ``y = clamp(round_div(sums * mult, counts << shift))``."""
    x, mult, shift = _operands(instr, bufs, consts, 3)
    a = instr.attrs
    kernel = [int(k) for k in a["kernel_shape"]]
    strides, pads, _ = ek.geometry(len(kernel), {**a, "dilations": None})
    sums, counts = ek.sum_pool(x, _pool_axes(instr, x, len(kernel)), kernel, strides, pads)
    if int(a.get("count_include_pad") or 0):
        counts = ek.numel(kernel)
    return [_divide(sums, counts, mult, shift, a)]


def _reduce(instr, bufs, consts) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]:
    """(int64 sum over ``axes``, elements per output, mult, shift)."""
    x, mult, shift = _operands(instr, bufs, consts, 3)
    axes = instr.attrs.get("axes")
    axes = range(x.ndim) if axes is None else [_axis(instr, int(a), x.ndim) for a in axes]
    axes = tuple(sorted({a % x.ndim for a in axes}))
    if _nhwc(instr) and x.ndim == 4 and 3 in axes:
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
    (x,) = _operands(instr, bufs, consts, 1)
    kernel = [int(k) for k in instr.attrs["kernel_shape"]]
    strides, pads, dil = ek.geometry(len(kernel), instr.attrs)
    return [ek.max_pool(x, _pool_axes(instr, x, len(kernel)), kernel, strides, pads, dil)]


def k_clip(instr, bufs, consts):
    """CLIP = QClip. FORMULA: ``y = min(max(x, lo), hi)``, bounds cut to x's dtype."""
    (x,) = _operands(instr, bufs, consts, 1)
    info = torch.iinfo(x.dtype)
    lo, hi = max(int(instr.attrs["lo"]), info.min), min(int(instr.attrs["hi"]), info.max)
    return [x.clamp(lo, hi)]


def _table(instr, consts: ConstPool, cls):
    """The instruction's table object, decoded once from its constants."""
    build = lambda: decode(cls, instr.attrs, [consts.arrays[c] for c in instr.consts])  # noqa: E731
    return consts.cached((cls.__name__, instr.consts), build)


def k_lut(instr, bufs, consts):
    """LUT. FORMULA: :func:`simulator.lut.lookup` on the decoded table."""
    table = _table(instr, consts, LutTable)
    return [lookup(table, bufs[instr.inputs[0]]).to(ek.TORCH_DTYPES[table.out_dtype])]


def k_softmax(instr, bufs, consts):
    """SOFTMAX. FORMULA: :func:`simulator.composite.int_softmax` along ``axis``."""
    t = _table(instr, consts, SoftmaxTables)
    y = int_softmax(bufs[instr.inputs[0]], int(instr.attrs["axis"]), t)
    return [y.to(ek.TORCH_DTYPES[t.out_dtype])]


def k_layernorm(instr, bufs, consts):
    """LAYERNORM. FORMULA: :func:`simulator.composite.int_layernorm` on the last axis."""
    t = _table(instr, consts, LayerNormTables)
    return [int_layernorm(bufs[instr.inputs[0]], t).to(ek.TORCH_DTYPES[t.out_dtype])]


def k_layout(instr, bufs, consts):
    """LAYOUT: the ONNX data-movement op ``attrs["op_type"]`` (exec_kernels.LAYOUT_OPS)."""
    op_type = instr.attrs.get("op_type")
    if op_type not in ek.LAYOUT_OPS:
        raise SimulatorError(
            f"unknown layout op {op_type!r}", hint=f"one of {sorted(ek.LAYOUT_OPS)}"
        )
    xs = [bufs[n] for n in instr.inputs]
    cs = [consts[c] if c else None for c in instr.consts]
    return ek.LAYOUT_OPS[op_type](xs, cs, instr.attrs, len(instr.outputs))


def _scale(instr, consts, x: torch.Tensor) -> tuple[torch.Tensor, int | None]:
    """(scale tensor, channel axis or None) from ``attrs["scale"]`` or the first const."""
    s = instr.attrs.get("scale")
    s = consts[instr.consts[0]] if s is None else torch.as_tensor(s, dtype=torch.float64)
    s = s.reshape(-1)
    return s, (None if s.numel() == 1 else int(instr.attrs.get("axis", 1)) % x.ndim)


def k_quantize(instr, bufs, consts):
    """QUANTIZE. FORMULA: ``clamp(round_by(x / scale), qrange(dtype))`` in x's float dtype."""
    x = bufs[instr.inputs[0]]
    s, axis = _scale(instr, consts, x)
    dtype = instr.attrs.get("dtype", "int8")
    q = fp.quantize(x, s, dtype, instr.attrs.get("rounding", "bpu_round"), axis)
    return [q.to(ek.TORCH_DTYPES[dtype])]


def k_dequantize(instr, bufs, consts):
    """DEQUANTIZE. FORMULA: ``y = float32(q) * float32(scale[c])`` (ONNX DequantizeLinear)."""
    q = bufs[instr.inputs[0]]
    s, axis = _scale(instr, consts, q)
    s = s.float().reshape(
        [-1 if i == axis else 1 for i in range(q.ndim)] if axis is not None else ()
    )
    return [q.float() * s]


_CPU_OPS = {"Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Exp": torch.exp, "Relu": torch.relu,
            "Add": torch.add, "Mul": torch.mul}  # fmt: skip


def k_cpu(instr, bufs, consts):
    """CPU: a float ONNX op (``attrs["op_type"]``) on float32 operands, in torch."""
    op_type = instr.attrs.get("op_type")
    if op_type not in _CPU_OPS:
        raise SimulatorError(f"CPU op {op_type!r} is not implemented",
                             hint=f"implemented: {', '.join(_CPU_OPS)}")  # fmt: skip
    xs = [t.float() for t in _operands(instr, bufs, consts)]
    return [_CPU_OPS[op_type](*xs)]


def k_preprocess(instr, bufs, consts):
    """PREPROCESS: board camera input -> int featuremap via ``simulator.board_input``."""
    if importlib.util.find_spec("simulator.board_input") is None:
        raise SimulatorError("PREPROCESS needs simulator.board_input",
                             hint="feed a featuremap input or install the board input module")  # fmt: skip
    board_input = importlib.import_module("simulator.board_input")
    frames = [bufs[n].numpy() for n in instr.inputs]  # nv12: (y, uv); else one frame
    x = frames[0] if len(frames) == 1 else tuple(frames)
    return [torch.from_numpy(np.ascontiguousarray(board_input.preprocess(x, instr.attrs)))]


KERNELS: dict[Op, Callable] = {
    Op.QUANTIZE: k_quantize, Op.PREPROCESS: k_preprocess, Op.CONV: k_conv,
    Op.LINEAR: k_linear, Op.MATMUL: k_matmul, Op.ADD: k_add, Op.MUL: k_mul,
    Op.REQUANT: k_requant, Op.AVGPOOL: k_avgpool, Op.REDUCE_MEAN: k_reduce_mean,
    Op.REDUCE_SUM: k_reduce_sum, Op.MAXPOOL: k_maxpool, Op.CLIP: k_clip, Op.LUT: k_lut,
    Op.SOFTMAX: k_softmax, Op.LAYERNORM: k_layernorm, Op.LAYOUT: k_layout,
    Op.DEQUANTIZE: k_dequantize, Op.CPU: k_cpu,
}  # fmt: skip
"""The one table: every :class:`Op` -> its whole-tensor kernel."""
assert set(KERNELS) == set(Op), "every op has a kernel"
_REZERO = frozenset({Op.LUT, Op.CLIP})


class Executor:
    """Runs a :class:`Program` on torch tensors; see the module docstring for the state.

    ``Executor(program, timings=True)`` records ``(index, op, seconds)`` per instruction of
    the last run in :attr:`timings` (``None`` when off, the default).
    """

    def __init__(self, program: Program, timings: bool = False):
        self.program = program
        _check_program(program)
        self.consts = ConstPool(program.constants)
        self.timings: list[tuple[int, Op, float]] | None = [] if timings else None

    def run(self, inputs: dict[str, np.ndarray], capture: bool = False):
        """(outputs by name, captures by layer id), numpy, in the reference layout.

        Captures (``program.captures``: layer id -> buffer) only when ``capture``; without
        it the second dict is empty and no copies are made.
        """
        bufs = self._load(inputs)
        self._run(bufs)
        outputs = {name: self._export(bufs, name) for name in self.program.outputs}
        captures = {}
        if capture:
            captures = {lid: self._export(bufs, b) for lid, b in self.program.captures.items()}
        return outputs, captures

    def buffer_shapes(self, inputs: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        """Every buffer's shape (stored layout) after one run: what the cost model needs."""
        bufs = self._load(inputs)
        self._run(bufs)
        return {name: tuple(t.shape) for name, t in bufs.items()}

    def _load(self, inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Program inputs as tensors (declared dtype), checking names and static shapes."""
        missing = set(self.program.inputs) - set(inputs)
        if missing:
            raise SimulatorError(f"missing inputs {sorted(missing)}", where="Executor.run")
        bufs = {}
        for name, spec in self.program.inputs.items():
            x = np.asarray(inputs[name])
            want = spec.get("shape")
            if want is not None and not _shape_ok(x.shape, want):
                raise SimulatorError(f"input {name} has shape {x.shape}, expected {want}",
                                     where="Executor.run")  # fmt: skip
            dtype = spec.get("dtype")
            x = x.astype(dtype) if dtype and x.dtype != np.dtype(dtype) else x
            bufs[name] = torch.from_numpy(x if x.flags.writeable else x.copy())
        return bufs

    def _run(self, bufs: dict[str, torch.Tensor]) -> None:
        """Execute every instruction in order, writing its outputs into ``bufs``."""
        if self.timings is not None:
            self.timings.clear()
        for i, instr in enumerate(self.program.instructions):
            t0 = time.perf_counter()
            try:
                ys = KERNELS[instr.op](instr, bufs, self.consts)
            except QparityError as e:
                raise SimulatorError(e.what, where=_where(i, instr, e.where), hint=e.hint) from e
            except (RuntimeError, ValueError, IndexError, KeyError, TypeError) as e:
                raise SimulatorError(str(e), where=_where(i, instr)) from e
            if instr.op in _REZERO and _nhwc(instr):
                ys = [
                    self._zero_padding(y, name) for y, name in zip(ys, instr.outputs, strict=True)
                ]
            bufs.update(zip(instr.outputs, ys, strict=True))
            if self.timings is not None:
                self.timings.append((i, instr.op, time.perf_counter() - t0))

    def _zero_padding(self, y: torch.Tensor, name: str) -> torch.Tensor:
        """Padding channels ``C..C_pad`` of an nhwc buffer set back to 0."""
        lay = self.program.layouts.get(name)
        if lay is None or y.ndim != 4 or not 0 < lay.channels < y.shape[3]:
            return y
        y = y.clone()
        y[..., lay.channels :] = 0
        return y

    def _export(self, bufs: dict[str, torch.Tensor], name: str) -> np.ndarray:
        """Buffer ``name`` in the reference layout (NCHW, padding dropped), as numpy."""
        return ek.to_reference(bufs[name], self.program.layouts.get(name)).numpy()

    def timings_by_op(self) -> dict[str, float]:
        """Seconds per op kind over the last run (empty when timings are off)."""
        out: dict[str, float] = {}
        for _, op, sec in self.timings or []:
            out[op.value] = out.get(op.value, 0.0) + sec
        return out


def _where(i: int, instr: Instruction, inner: str | None = None) -> str:
    ids = ",".join(instr.layer_ids) or "-"
    return f"instruction {i} ({instr.op.value}, layers {ids})" + (f": {inner}" if inner else "")


def _shape_ok(shape: tuple[int, ...], want) -> bool:
    """Static dims must match; None, strings and negative dims are free."""
    if len(shape) != len(want):
        return False
    return all(not isinstance(w, int) or w < 0 or w == s for s, w in zip(shape, want, strict=True))


def _check_program(program: Program) -> None:
    """Every op known, every buffer defined before use, every constant present."""
    defined = set(program.inputs)
    for i, instr in enumerate(program.instructions):
        if instr.op not in KERNELS:
            raise SimulatorError(f"unknown op {instr.op!r}", where=f"instruction {i}")
        undefined = [n for n in instr.inputs if n not in defined]
        absent = [c for c in instr.consts if c and c not in program.constants]
        if undefined or absent:
            raise SimulatorError(f"undefined buffers {undefined} / constants {absent}",
                                 where=_where(i, instr), hint="check the program's order")  # fmt: skip
        defined.update(instr.outputs)
    lost = [b for b in [*program.outputs, *program.captures.values()] if b not in defined]
    if lost:
        raise SimulatorError(f"outputs/captures {lost} are never written", where="program")
