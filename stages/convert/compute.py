"""Integer forms of the compute ops (formulas: the stages.convert.rules docstring)."""

from __future__ import annotations

import numpy as np
import onnx

from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import aligned_multipliers, fixed_multiplier
from stages.convert.graph import Converter, QTensor, _attr
from stages.convert.rules import _bits, _mult, _req, check_ratio
from stages.onnx_builder import DOMAIN


def _out(c: Converter, k: int, node: onnx.NodeProto):
    """(scale, dtype, Q node, its index) of the node's output quantizer, or None."""
    users = c.users[node.output[0]]
    if len(users) != 1 or c.src.graph.node[users[0]].op_type != "QuantizeLinear":
        return None
    q = c.src.graph.node[users[0]]
    scale, dtype, _ = c.q_params(q)
    return scale, dtype, q, users[0]


def _into_quantizer(
    c: Converter, spec, op: str, inputs: list[str], domain: str = DOMAIN, **attrs
) -> bool:
    """Emit ``op`` writing straight into the output quantizer's integer tensor, and record
    that tensor as the quantizer's output (the QuantizeLinear itself is then skipped)."""
    out = spec[2].output[0]
    c.emit(op, inputs, [out], domain=domain, **attrs)
    c.produce(spec[2], QTensor(out, np.asarray(spec[0]), spec[1]), spec[3])
    return True


def _weighted(
    c: Converter,
    node,
    op: str,
    x: QTensor,
    w_name: str,
    w_scale,
    bias,
    attrs: dict,
    spec,
    acc_axis: int,
) -> bool:
    """conv / linear: int32 bias at ``s_x * s_w``; requantize into the output quantizer,
    or keep the int32 accumulator (high-precision output, or fused with the next add)."""
    acc_scale = float(x.scale) * np.asarray(w_scale, dtype=np.float64).reshape(-1)
    b = (
        np.zeros(0, np.int32)
        if bias is None
        else np.asarray(fp.quantize(bias, acc_scale, "int32", c.settings.rounding, 0)).astype(
            np.int32
        )
    )
    if spec is None:
        out, empty = f"{node.output[0]}#acc", np.zeros(0, np.int64)
        mult, shift = c.const("mult", empty), c.const("shift", empty)
        req = {"out_dtype": "int32", "rounding": c.settings.rounding}
    else:
        out, req = spec[2].output[0], _req(c, out_dtype=spec[1])
        mult, shift = _mult(c, "req", acc_scale / float(spec[0]))
    c.emit(
        op,
        [x.name, w_name, c.const("bias", b), mult, shift],
        [out],
        domain=DOMAIN,
        **attrs,
        **req,
        relu=0,
    )
    if spec is None:
        c.qt[node.output[0]] = QTensor(out, acc_scale, "int32", acc_axis)
    else:
        c.produce(spec[2], QTensor(out, np.asarray(spec[0]), spec[1]), spec[3])
    return True


def conv(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    x, w = c.qt.get(node.input[0]), c.qt.get(node.input[1])
    if x is None or w is None or x.scale.size != 1:
        return False
    bias = c.inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    nd = c.new_inits[w.name].ndim - 2
    attrs = {
        "strides": _attr(node, "strides", [1] * nd),
        "pads": _attr(node, "pads", [0] * 2 * nd),
        "dilations": _attr(node, "dilations", [1] * nd),
        "group": _attr(node, "group", 1),
    }
    return _weighted(c, node, "QConv", x, w.name, w.scale, bias, attrs, _out(c, k, node), -(nd + 1))


def gemm(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    x, w = c.qt.get(node.input[0]), c.qt.get(node.input[1])
    plain = (
        _attr(node, "transB", 0) == 1
        and not _attr(node, "transA", 0)
        and _attr(node, "alpha", 1.0) == 1.0
        and _attr(node, "beta", 1.0) == 1.0
    )
    if x is None or w is None or not plain or x.scale.size != 1:
        return False
    bias = c.inits.get(node.input[2]) if len(node.input) > 2 else None
    return _weighted(c, node, "QLinear", x, w.name, w.scale, bias, {}, _out(c, k, node), -1)


def matmul(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    a, b = c.qt.get(node.input[0]), c.qt.get(node.input[1])
    if a is None or b is None or a.scale.size != 1:
        return False
    if b.name in c.new_inits:  # x @ W^T (+ bias): a linear layer on a >2-D input
        return _linear3d(c, k, node, a, b)
    spec = _out(c, k, node)
    if spec is None or b.scale.size != 1:
        return False
    mult, shift = _mult(c, "req", float(a.scale) * float(b.scale) / float(spec[0]))
    return _into_quantizer(
        c, spec, "QMatMul", [a.name, b.name, mult, shift], **_req(c, out_dtype=spec[1])
    )


def _linear3d(c: Converter, k, node, a: QTensor, b: QTensor) -> bool:
    users = c.users[node.output[0]]
    add = c.src.graph.node[users[0]] if len(users) == 1 else None
    bias = None
    if add is not None and add.op_type == "Add" and add.input[1] in c.inits:
        bias, tail = c.inits[add.input[1]], add
        c.skip.add(users[0])
    else:
        tail = node
    w_t = c.const("wT", np.ascontiguousarray(c.new_inits[b.name].T))
    return _weighted(c, tail, "QLinear", a, w_t, b.scale, bias, {}, _out(c, k, tail), -1)


def add(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    a, b, spec = c.qt.get(node.input[0]), c.qt.get(node.input[1]), _out(c, k, node)
    if a is None or spec is None:
        return False
    s_out, sign = float(spec[0]), (-1 if node.op_type == "Sub" else 1)
    if b is None:
        if node.input[1] not in c.inits or a.scale.size != 1:
            return False
        check_ratio(c, float(a.scale) / s_out, "add")
        ma, shift = fixed_multiplier(float(a.scale) / s_out, _bits(c), c.settings.rounding)
        term = np.round(sign * c.inits[node.input[1]] / s_out * 2.0 ** int(shift))
        ins = [
            a.name,
            c.const("c", term.astype(np.int64)),
            c.const("ma", np.atleast_1d(ma)),
            c.const("mb", np.ones(1, np.int64)),
            c.const("shift", np.atleast_1d(shift)),
        ]
    else:
        ratios = [_bcast(a) / s_out, _bcast(b) / s_out]
        for r in ratios:
            check_ratio(c, r, "add")
        (ma, mb), shift = aligned_multipliers(ratios, _bits(c), c.settings.rounding)
        ins = [
            a.name,
            b.name,
            c.const("ma", np.asarray(ma, np.int64)),
            c.const("mb", sign * np.asarray(mb, np.int64)),
            c.const("shift", np.atleast_1d(shift).astype(np.int64)),
        ]
    return _into_quantizer(c, spec, "QAdd", ins, **_req(c, out_dtype=spec[1]), relu=0)


def _bcast(q: QTensor) -> np.ndarray:
    """A scale shaped to broadcast against its tensor (per-channel: [C, 1, ...])."""
    s = np.asarray(q.scale, dtype=np.float64)
    if q.axis is None or s.size == 1:
        return s.reshape(-1)[:1] if s.size == 1 else s
    return s.reshape([-1] + [1] * (-q.axis - 1))


def mul(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    a, b, spec = c.qt.get(node.input[0]), c.qt.get(node.input[1]), _out(c, k, node)
    if a is None or spec is None or a.scale.size != 1:
        return False
    if b is None:
        const = c.inits.get(node.input[1])
        if const is None or const.size != 1 or float(const.reshape(-1)[0]) <= 0:
            return False
        value = float(const.reshape(-1)[0])  # a scalar or shape [1] (the dynamo exporter's)
        factor = value if node.op_type == "Mul" else 1.0 / value
        return _rescale(c, a, float(a.scale) * factor / float(spec[0]), spec)
    if b.scale.size != 1 or node.op_type != "Mul":
        return False
    mult, shift = _mult(c, "req", float(a.scale) * float(b.scale) / float(spec[0]))
    return _into_quantizer(
        c, spec, "QMul", [a.name, b.name, mult, shift], **_req(c, out_dtype=spec[1])
    )


def _rescale(c: Converter, a: QTensor, ratio: float, spec) -> bool:
    mult, shift = _mult(c, "req", ratio)
    return _into_quantizer(c, spec, "QRequant", [a.name, mult, shift], **_req(c, out_dtype=spec[1]))


def reduce_mean(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """ReduceMean / GlobalAveragePool -> QReduceMean, ReduceSum -> QReduceSum (the same
    requantize ``s_in / s_out``; the mean also divides by the element count)."""
    a, spec = c.qt.get(node.input[0]), _out(c, k, node)
    if a is None or spec is None or a.scale.size != 1:
        return False
    if node.op_type == "GlobalAveragePool":
        axes, keep = [2, 3], 1
    else:
        axes = (
            [int(v) for v in c.inits[node.input[1]]] if len(node.input) > 1 else _attr(node, "axes")
        )
        keep = _attr(node, "keepdims", 1)
    mult, shift = _mult(c, "req", float(a.scale) / float(spec[0]))
    return _into_quantizer(
        c,
        spec,
        "QReduceSum" if node.op_type == "ReduceSum" else "QReduceMean",
        [a.name, mult, shift],
        axes=list(axes),
        keepdims=int(keep),
        **_req(c, out_dtype=spec[1]),
    )


def avg_pool(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    a, spec = c.qt.get(node.input[0]), _out(c, k, node)
    if a is None or spec is None or a.scale.size != 1 or _attr(node, "ceil_mode", 0):
        return False
    kernel = _attr(node, "kernel_shape")
    attrs = {
        "kernel_shape": kernel,
        "strides": _attr(node, "strides", [1] * len(kernel)),
        "pads": _attr(node, "pads", [0] * 2 * len(kernel)),
        "count_include_pad": _attr(node, "count_include_pad", 0),
    }
    mult, shift = _mult(c, "req", float(a.scale) / float(spec[0]))
    return _into_quantizer(
        c, spec, "QAvgPool", [a.name, mult, shift], **attrs, **_req(c, out_dtype=spec[1])
    )


def concat(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    ins, spec = [c.qt.get(n) for n in node.input], _out(c, k, node)
    if any(q is None or q.scale.size != 1 for q in ins):
        return False
    if spec is None:
        return _concat_as_is(c, node, ins)
    names = []
    for q in ins:
        if float(q.scale) == float(spec[0]) and q.dtype == spec[1]:
            names.append(q.name)
            continue
        m, s = _mult(c, "align", float(q.scale) / float(spec[0]))
        names.append(f"{q.name}#to_{spec[2].output[0]}")
        c.emit("QRequant", [q.name, m, s], [names[-1]], domain=DOMAIN, **_req(c, out_dtype=spec[1]))
    return _into_quantizer(c, spec, "Concat", names, domain="", axis=_attr(node, "axis"))


def _concat_as_is(c: Converter, node: onnx.NodeProto, ins: list[QTensor]) -> bool:
    """No output quantizer (the windows of an uneven adaptive max pool): the integers
    joined as they are when every input has one scale and dtype, else a float island."""
    if any(float(q.scale) != float(ins[0].scale) or q.dtype != ins[0].dtype for q in ins):
        return False
    out = f"{node.output[0]}#q"
    c.emit("Concat", [q.name for q in ins], [out], axis=_attr(node, "axis"))
    c.qt[node.output[0]] = QTensor(out, ins[0].scale, ins[0].dtype)
    return True
