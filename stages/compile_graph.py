"""quantized.onnx -> a BPU Program (simulator.program.isa): instructions, layouts, packed constants.

- Every integer node becomes one instruction (simulator.instructions.FROM_ONNX); standard layout
  ops become LAYOUT; the input QuantizeLinear becomes QUANTIZE and output
  DequantizeLinear DEQUANTIZE; a float island's nodes become CPU instructions.
- Fusion: a relu (QClip with lo = 0 and hi = the dtype max) after a conv or add whose only
  user it is becomes that instruction's ``relu`` flag; the instruction covers both layer
  ids. Any other QClip keeping 0 (a ReLU6) after a requantizing conv becomes its ``clip``
  bounds the same way (the conv's epilogue clamps to them). A conv or linear that keeps
  its int32 accumulator (no mult/shift: convert requantizes conv + add once, in the add)
  and whose only user is a QAdd of two buffers becomes one CONV (LINEAR) instruction
  ``x, b -> y`` with consts ``w, bias, mult, shift, ma, mb, add_shift`` (the accumulator
  takes the add's ``a`` role), emitted at the add, covering the conv, the add and a fused
  relu (simulator.kernels.exec_conv, exec_ops.k_linear).
- Layout: the 4-D activations of group-1 convolutions and of the elementwise ops and pools
  around them are stored NHWC with channels padded to the march's alignment; weights are
  packed [O_pad, kh, kw, C_pad] and per-channel constants padded (multiplier 0 in padding
  channels). Conversions (LAYOUT ToNHWC / ToNCHW) are inserted where layouts change.
Compile must not change a number: the layout is undone when layers are captured.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from simulator.instructions import FROM_ONNX, NHWC_OPS
from simulator.program.isa import Instruction, Layout, Op, Program
from stages.convert.graph import _layer_id


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = (
            v.decode() if isinstance(v, bytes) else (list(v) if isinstance(v, (list, tuple)) else v)
        )
    return out


class Compiler:
    """One compilation of a quantized.onnx model for a march with a channel alignment."""

    def __init__(
        self, model: onnx.ModelProto, march: str, alignment: int, shapes: dict[str, tuple[int, ...]]
    ):
        self.model, self.march, self.align, self.shapes = model, march, alignment, shapes
        self.inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.users: dict[str, list[onnx.NodeProto]] = {}
        for n in model.graph.node:
            for i in n.input:
                self.users.setdefault(i, []).append(n)
        self.instrs: list[Instruction] = []
        self.consts: dict[str, np.ndarray] = {}
        self.layouts: dict[str, Layout] = {}
        self.fused: set[str] = set()
        self.size_values: set[str] = set()  # computed on the CPU from run-time sizes

    def run(self, captures: dict[str, str]) -> Program:
        """Translate every node; ``captures``: layer id -> integer tensor of quantized.onnx."""
        self.conv_of_add = self._conv_add_pairs()
        self.fused.update(conv.name for conv in self.conv_of_add.values())
        for node in self.model.graph.node:
            if node.name in self.conv_of_add:
                self._conv_add(self.conv_of_add[node.name], node)
            elif node.name not in self.fused:
                self._node(node)
        outs = {o.name: {"dtype": "float32"} for o in self.model.graph.output}
        ins = {
            i.name: {  # token ids and masks stay integers (int64), the rest float32
                "dtype": onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name,
                "format": "featuremap",
                "shape": [d.dim_value or -1 for d in i.type.tensor_type.shape.dim],
            }
            for i in self.model.graph.input
        }
        live = {b for ins_ in self.instrs for b in (*ins_.inputs, *ins_.outputs)}
        caps = {lid: t for lid, t in captures.items() if t in live}
        return Program(self.march, ins, outs, self.instrs, self.consts, self.layouts, caps)

    # -- one node ------------------------------------------------------------------

    def _node(self, node: onnx.NodeProto) -> None:
        lid, attrs, sizes = _layer_id(node), _attrs(node), self._sizes(node)
        if node.domain == "qparity" and node.op_type in FROM_ONNX:
            op = FROM_ONNX[node.op_type]
        elif node.op_type == "QuantizeLinear" and node.input[0] not in self.inits:
            op, attrs = Op.QUANTIZE, self._qattrs(node, attrs)
        elif node.op_type == "DequantizeLinear":
            op, attrs = Op.DEQUANTIZE, self._qattrs(node, attrs)
        elif not node.domain and node.op_type in LAYOUT_TYPES and not sizes:
            op, attrs = Op.LAYOUT, {"op_type": node.op_type, **attrs}
            if node.op_type == "Gather" and data_is_table(node, self.inits):
                attrs["table"] = 1  # an embedding: the table is the constant operand
        else:
            op, attrs = Op.CPU, {"op_type": node.op_type, **attrs, **self._operands(node)}
        data = [i for i in node.input if i and i not in self.inits]
        consts = [i for i in node.input if i in self.inits]
        if op in (Op.QUANTIZE, Op.DEQUANTIZE):
            consts = []
        self._emit(op, node, data, consts, attrs, [lid])

    def _sizes(self, node: onnx.NodeProto) -> bool:
        """True for a node of a run-time size computation: ``Shape``, and a node whose
        buffers all come from one (the Concat building a class token's ``Expand`` target,
        the Expand of the constant token itself). It runs on the CPU, in the graph's
        operand order."""
        data = [i for i in node.input if i and i not in self.inits]
        if node.op_type == "Shape" or (data and all(i in self.size_values for i in data)):
            self.size_values.update(node.output)
            return True
        return False

    def _qattrs(self, node: onnx.NodeProto, attrs: dict) -> dict:
        scale = np.asarray(self.inits[node.input[1]], dtype=np.float64).reshape(-1)
        zp = self.inits[node.input[2]] if len(node.input) > 2 else np.zeros(1, np.int8)
        return {
            "scale": scale.tolist(),
            "axis": attrs.get("axis", 1),
            "dtype": str(zp.dtype),
            "rounding": attrs.get("rounding", "half_even"),
        }

    def _emit(self, op: Op, node, data, consts, attrs, lids, conv=None) -> None:
        """One instruction for ``node`` (with a fused relu; ``conv``: the conv of a fused
        conv + add, whose weights decide the layout)."""
        outputs = list(node.output)
        act = self._fused_activation(op, node, conv)
        if act is not None:
            clip, extra = act
            self.fused.add(clip.name)
            attrs, outputs, lids = {**attrs, **extra}, list(clip.output), lids + [_layer_id(clip)]
        src = conv if conv is not None else node
        nhwc = op in NHWC_OPS and self._nhwc_ok(op, src, attrs)
        nhwc = nhwc and (conv is None or self._nhwc_ok(Op.ADD, node, attrs))
        data = [self._to_layout(b, "nhwc" if nhwc else "plain") for b in data]
        if nhwc:
            attrs = {**attrs, "layout": "nhwc"}
            packed = self._pack(op, src, consts if conv is None else consts[:4], attrs)
            if conv is not None:
                packed += self._pack_add(consts[4:], self._channels(conv))
            consts = packed
            for o in outputs:
                self.layouts[o] = self._nhwc_layout(op, src, data)
        names = [self._const(c) if isinstance(c, str) else self._const_array(*c) for c in consts]
        self.instrs.append(
            Instruction(op, tuple(data), tuple(outputs), tuple(names), attrs, tuple(lids))
        )

    def _operands(self, node: onnx.NodeProto) -> dict:
        """A CPU island's input order (``d`` buffer, ``c`` constant, ``-`` omitted) and
        the graph's opset, for simulator.kernels.exec_cpu."""
        order = "".join("-" if not i else "c" if i in self.inits else "d" for i in node.input)
        opset = next(
            (o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 21
        )
        return {"operands": order, "opset": int(opset)}

    # -- fusion and layout ------------------------------------------------------------

    def _conv_add_pairs(self) -> dict[str, onnx.NodeProto]:
        """add name -> the conv it absorbs: an int32-accumulator QConv or QLinear (empty
        mult/shift) whose only user is a QAdd of two non-constant inputs (the first such
        input)."""
        producer = {o: n for n in self.model.graph.node for o in n.output}
        pairs = {}
        for add in self.model.graph.node:
            if add.op_type != "QAdd" or any(i in self.inits for i in add.input[:2]):
                continue
            for i in add.input[:2]:
                conv = producer.get(i)
                if conv is not None and self._accumulates(conv) and len(self.users[i]) == 1:
                    pairs[add.name] = conv
                    break
        return pairs

    def _accumulates(self, node) -> bool:
        """A QConv or QLinear that outputs its int32 accumulator (no requantize, no relu)
        to no graph output."""
        a = _attrs(node)
        return (
            node.op_type in ("QConv", "QLinear")
            and a.get("out_dtype") == "int32"
            and not a.get("relu", 0)
            and node.output[0] not in {o.name for o in self.model.graph.output}
            and all(self.inits[c].size == 0 for c in node.input[3:5] if c in self.inits)
        )

    def _conv_add(self, conv, add) -> None:
        """Emit conv + add (+ relu) as one CONV (a linear: one LINEAR): inputs ``x, b``;
        consts ``w, bias, mult, shift, ma, mb, add_shift``; the add's out_dtype, rounding
        and relu."""
        ma, mb, shift = add.input[2:5]
        other = add.input[1] if add.input[0] == conv.output[0] else add.input[0]
        if other == add.input[0]:  # conv output was the add's b: swap the multipliers
            ma, mb = mb, ma
        a = _attrs(add)
        attrs = {**_attrs(conv), "out_dtype": a["out_dtype"], "rounding": a["rounding"],
                 "relu": a.get("relu", 0)}  # fmt: skip
        self._emit(FROM_ONNX[conv.op_type], add, [conv.input[0], other],
                   [*conv.input[1:5], ma, mb, shift], attrs, [_layer_id(conv), _layer_id(add)],
                   conv=conv)  # fmt: skip

    def _fused_activation(self, op: Op, node, conv) -> tuple[onnx.NodeProto, dict] | None:
        """The QClip fused into ``node``'s instruction and the attrs it sets: a relu as the
        ``relu`` flag (conv or add), another clip keeping 0 as a conv's ``clip`` bounds."""
        relu = self._fusable_relu(op, node)
        if relu is not None:
            return relu, {"relu": 1}
        clip = None if conv is not None else self._fusable_clip(op, node)
        return (
            None if clip is None else (clip, {"clip": [int(_attrs(clip)[k]) for k in ("lo", "hi")]})
        )

    def _fusable_relu(self, op: Op, node) -> onnx.NodeProto | None:
        if op not in (Op.CONV, Op.ADD) or _attrs(node).get("out_dtype") == "int32":
            return None
        users = self.users.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "QClip":
            return None
        a = _attrs(users[0])
        qmax = 127 if _attrs(node)["out_dtype"] == "int8" else 32767
        return users[0] if a.get("lo") == 0 and a.get("hi") == qmax else None

    def _fusable_clip(self, op: Op, node) -> onnx.NodeProto | None:
        """The QClip that is the only user of a requantizing QConv's output and keeps 0 (lo
        <= 0 <= hi: ReLU6), fused as the conv's ``clip`` bounds; 0 staying 0 keeps an nhwc
        buffer's padding channels 0."""
        if op is not Op.CONV or _attrs(node).get("out_dtype") in (None, "int32"):
            return None
        users = self.users.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "QClip":
            return None
        a = _attrs(users[0])
        return users[0] if int(a["lo"]) <= 0 <= int(a["hi"]) else None

    def _nhwc_ok(self, op: Op, node, attrs) -> bool:
        if len(self.shapes.get(node.output[0], ())) != 4:
            return False
        if op is Op.CONV:
            return attrs.get("group", 1) == 1
        if op is Op.ADD:  # per-channel multipliers must be [C, 1, 1] or scalars, a
            # constant operand (swin's relative position bias) a scalar: it is not packed,
            # and no operand broadcast over channels (x + x[:, :1]): padded channels hold 0
            return (
                all(self.inits[c].size == 1 or self.inits[c].ndim == 3 for c in node.input[2:4])
                and all(self.inits[c].size == 1 for c in node.input[:2] if c in self.inits)
                and all(self._full_channels(i, node.output[0]) for i in node.input[:2])
            )
        if op in (Op.CLIP, Op.REQUANT) and self.layouts.get(node.input[0], Layout()).kind != "nhwc":
            return False  # elementwise on a plain buffer: converting would only add work
        return op in (Op.CLIP, Op.MAXPOOL) or (
            op is Op.REQUANT and all(self.inits[c].size == 1 for c in node.input[1:3])
        )

    def _full_channels(self, buf: str, out: str) -> bool:
        """``buf`` (a constant: checked apart) is 4-D with ``out``'s channels (broadcast
        over H and W is fine NHWC)."""
        shape = self.shapes.get(buf, ())
        return buf in self.inits or (len(shape) == 4 and shape[1] == self.shapes[out][1])

    def _channels(self, node) -> int:
        w = self.inits.get(node.input[1]) if len(node.input) > 1 else None
        if w is not None and w.ndim == 4:
            return int(w.shape[0])
        return self.layouts[node.input[0]].channels if node.input[0] in self.layouts else 0

    def _nhwc_layout(self, op, node, data) -> Layout:
        c = self._channels(node) or self.layouts[data[0]].channels
        return Layout("nhwc", c, _round_up(c, self.align))

    def _to_layout(self, buf: str, kind: str) -> str:
        have = self.layouts.get(buf, Layout())
        if have.kind == kind or len(self.shapes.get(buf, ())) != 4:
            return buf
        out = f"{buf}@{kind}"
        if out in self.layouts:  # converted before: reuse it
            return out
        if kind == "nhwc":
            c = int(self.shapes[buf][1])
            lay = Layout("nhwc", c, _round_up(c, self.align))
            attrs = {"op_type": "ToNHWC", "channels_padded": lay.channels_padded}
        else:
            lay, attrs = Layout(), {"op_type": "ToNCHW", "channels": have.channels}
        self.instrs.append(Instruction(Op.LAYOUT, (buf,), (out,), (), attrs, ()))
        self.layouts[out] = lay
        return out

    def _pack(self, op: Op, node, consts, attrs) -> list:
        """Constants in the march's layout: padded weights and per-channel arrays."""
        if op is Op.CONV:
            return _pack_conv(self, node, self.align)
        if op is Op.ADD:
            return self._pack_add(consts, self._channels(node))
        return consts

    def _pack_add(self, consts, channels: int) -> list:
        """QAdd multipliers on the nhwc last axis, padded (scalars stay scalars)."""
        c_pad = _round_up(channels or 1, self.align)
        return [
            c
            if self.inits[c].size == 1
            else (f"{c}@nhwc", _pad_last(self.inits[c].reshape(-1), c_pad))
            for c in consts
        ]

    def _const(self, name: str) -> str:
        self.consts.setdefault(name, self.inits[name])
        return name

    def _const_array(self, name: str, value: np.ndarray) -> str:
        self.consts[name] = np.ascontiguousarray(value)
        return name


LAYOUT_TYPES = {
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Slice",
    "Gather",
    "Split",
    "Concat",
    "Pad",
    "Identity",
    "Expand",
}


def _round_up(c: int, align: int) -> int:
    return -(-c // align) * align


def _pad_last(a: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=a.dtype)
    out[: a.size] = a
    return out


def _pack_conv(comp: Compiler, node, align: int) -> list:
    """QConv constants: weight [O_pad, kh, kw, C_pad], bias/mult/shift padded to O_pad."""
    w, bias, mult, shift = (comp.inits[n] for n in node.input[1:5])
    o, c = w.shape[:2]
    o_pad, c_pad = _round_up(o, align), _round_up(c, align)
    packed = np.zeros((o_pad, *w.shape[2:], c_pad), dtype=w.dtype)
    packed[:o, ..., :c] = np.moveaxis(w, 1, -1)
    per_ch = [
        (f"{n}@nhwc", _pad_last(np.broadcast_to(a, (o,)).copy(), o_pad) if a.size else a)
        for n, a in zip(node.input[2:5], (bias, mult, shift), strict=True)
    ]
    return [(f"{node.input[1]}@packed", packed), *per_ch]


def data_is_table(node: onnx.NodeProto, inits: dict) -> bool:
    """A Gather of a constant table by a run-time index buffer (an embedding)."""
    return node.input[0] in inits and node.input[1] not in inits
