"""The integer form of each qat.onnx op: one rule per (domain, op_type).

A rule returns True when it emitted the integer form, False to leave the node a float
island. Requantize everywhere is ``out = clamp(round((acc * m) / 2**n))`` with the integer
multiplier ``m / 2**n ~ ratio`` of the scales (``|m| < 2**(multiplier_bits - 1)``):
- conv / linear: ``acc = sum(x_q * w_q) + bias_q``, ``bias_q = round(b / (s_x * s_w))``
  (int32), ``ratio = s_x * s_w / s_out`` per output channel;
- add / sub: ``(a*m_a + b*m_b) >> n`` with ``m_a / 2**n ~ s_a / s_out``,
  ``m_b / 2**n ~ s_b / s_out`` (one shared shift, the BPU's scale alignment);
- mul: ``ratio = s_a * s_b / s_out``; mean / average pool: ``ratio = s_in / s_out`` and
  one rounded division by the element count.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from schemas.errors import StageError
from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import fixed_multiplier, ratio_limit
from stages.convert.graph import ZP, Converter, QTensor, _attr
from stages.onnx_builder import DOMAIN


def _bits(c: Converter) -> int:
    return c.settings.multiplier_bits - 1


def check_ratio(c: Converter, ratio, tag: str) -> None:
    """A StageError naming the layer when a requantize ratio needs a wider multiplier than
    ``multiplier_bits`` (``fixed_multiplier`` holds ratios below ``2**(bits-1) - 1``)."""
    r, limit = np.asarray(ratio, dtype=np.float64), ratio_limit(_bits(c))
    if not np.any(np.isfinite(r) & (r >= limit)):
        return  # in range (a zero or non-finite ratio: fixed_multiplier's own error)
    bits = c.settings.multiplier_bits
    worst = float(np.max(r[np.isfinite(r)]))
    raise StageError(
        f"the {tag} ratio of its scales is {worst:.6g}, beyond {bits}-bit multipliers: "
        f"m / 2**s with |m| < 2**{bits - 1} and s >= 0 holds ratios below {limit:g}",
        where=f"convert, layer {c.layer}",
        hint="widen the multipliers (stages.convert.multiplier_bits: 16 or more; 32 with "
        "quant.high_precision_qpp: true or quant.consistency_level: 0), or give the layer's "
        "input and output one dtype (quant.overrides); a tiny output scale from a layer "
        "that saw no data needs recalibrating instead",
    )


def _mult(c: Converter, tag: str, ratio) -> tuple[str, str]:
    check_ratio(c, ratio, tag)
    m, s = fixed_multiplier(np.asarray(ratio, dtype=np.float64), _bits(c), c.settings.rounding)
    return (
        c.const(f"{tag}_mult", np.atleast_1d(m).astype(np.int64)),
        c.const(f"{tag}_shift", np.atleast_1d(s).astype(np.int64)),
    )


def _req(c: Converter, **attrs) -> dict:
    return {"rounding": c.settings.rounding, **attrs}


def quantize(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """A weight initializer becomes integers; an integer input is reused or rescaled."""
    x, out = node.input[0], node.output[0]
    scale, dtype, axis = c.q_params(node)
    rounding = _attr(node, "rounding", b"half_even")
    rounding = rounding.decode() if isinstance(rounding, bytes) else rounding
    if x in c.inits:
        ch = axis if scale.size > 1 else None
        q = fp.quantize(
            c.inits[x],
            scale.reshape(-1) if ch is not None else float(scale.reshape(-1)[0]),
            dtype,
            rounding,
            ch,
        )
        c.produce(node, QTensor(c.const("w", np.asarray(q).astype(ZP[dtype])), scale, dtype, axis))
        return True
    src = c.qt.get(x)
    if src is not None and src.dtype == dtype and np.array_equal(src.scale, scale):
        c.produce(node, src)
        return True
    if src is not None and src.scale.size == 1 and scale.size == 1:
        m, s = _mult(c, "rescale", src.scale / scale)
        c.emit("QRequant", [src.name, m, s], [out], domain=DOMAIN, **_req(c, out_dtype=dtype))
    else:
        c.float_island(node)
    c.produce(node, QTensor(out, scale, dtype, axis))
    return True


def dequantize(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """No node: the output is known to be the integer input times the scale."""
    src = c.ints.get(node.input[0])
    if src is None:
        return False
    scale, dtype, axis = c.q_params(node)
    c.qt[node.output[0]] = QTensor(src.name, scale, dtype, src.axis if axis is None else axis)
    return True


def table(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """Lut / Softmax / LayerNorm already compute on integers: feed them ours."""
    src = c.ints.get(node.input[0])
    if src is None:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    c.emit(node.op_type, [src.name, *node.input[1:]], [node.output[0]], DOMAIN, attrs)
    out_dtype = (
        attrs["out_dtype"].decode() if isinstance(attrs["out_dtype"], bytes) else attrs["out_dtype"]
    )
    c.ints[node.output[0]] = QTensor(node.output[0], np.ones(1), out_dtype)
    return True


def passthrough(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """Layout / selection ops: the same op on the integers, the same scale."""
    src = c.qt.get(node.input[0])
    if src is not None and node.op_type == "Transpose" and src.name in c.new_inits:
        return _transpose_weight(c, node, src)
    if src is None or (src.axis is not None and node.op_type != "Identity"):
        return False
    outs = [f"{o}#q" for o in node.output]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    c.emit(node.op_type, [src.name, *node.input[1:]], outs, attrs=attrs)
    for o, q in zip(node.output, outs, strict=True):
        c.qt[o] = QTensor(q, src.scale, src.dtype)
    return True


def _transpose_weight(c: Converter, node: onnx.NodeProto, src: QTensor) -> bool:
    """A transposed integer weight is a transposed integer constant (its channel axis moves)."""
    perm = list(_attr(node, "perm"))
    data = np.ascontiguousarray(np.transpose(c.new_inits[src.name], perm))
    axis = perm.index(src.axis) if src.axis is not None else None
    c.qt[node.output[0]] = QTensor(c.const("wT", data), src.scale, src.dtype, axis)
    return True


def clip(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """Relu / Clip on integers: bounds in input steps (zero point 0 keeps 0 exact)."""
    src = c.qt.get(node.input[0])
    if src is None or src.scale.size != 1:
        return False
    qmin, qmax = fp.qrange(src.dtype)
    lo, hi = (
        (0.0, None)
        if node.op_type == "Relu"
        else (_const_input(c, node, 1), _const_input(c, node, 2))
    )
    to_q = lambda v, d: d if v is None else int(fp.round_by(v / float(src.scale), "half_even"))  # noqa: E731
    lo_q, hi_q = max(qmin, to_q(lo, qmin)), min(qmax, to_q(hi, qmax))
    out = f"{node.output[0]}#q"
    c.emit("QClip", [src.name], [out], domain=DOMAIN, lo=lo_q, hi=hi_q)
    c.qt[node.output[0]] = QTensor(out, src.scale, src.dtype)
    return True


def max_pool(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """Max-pool is exact on integers (padding by the dtype's minimum)."""
    src = c.qt.get(node.input[0])
    if src is None or src.axis is not None:
        return False
    attrs = {a: _attr(node, a) for a in ("kernel_shape", "strides", "pads", "dilations")}
    out = f"{node.output[0]}#q"
    c.emit(
        "QMaxPool",
        [src.name],
        [out],
        domain=DOMAIN,
        **{a: v for a, v in attrs.items() if v is not None},
    )
    c.qt[node.output[0]] = QTensor(out, src.scale, src.dtype)
    return True


def _const_input(c: Converter, node: onnx.NodeProto, i: int) -> float | None:
    if len(node.input) <= i or not node.input[i]:
        return None
    return float(c.inits[node.input[i]])
