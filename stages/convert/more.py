"""Integer forms of ops #18 item 3 added, from instructions the BPU already has
(formulas as in stages.convert.rules).

maximum / minimum: both inputs are requantized to the output quantizer's scale (the rounding is monotonic, so
``max(round(a), round(b)) == round(max(a, b))`` on the requantized values), then
``max(a, b) = a + relu(b - a)`` and ``min(a, b) = a - relu(a - b)``: the difference one
width up (int8 -> int16, int16 -> int32: it never overflows), the relu a QClip, the sum a
QAdd into the output dtype (the result is one of the inputs, so it never saturates).

prelu (per-channel slopes w_c): ``y = relu(x) * s_x / s_y + min(x, 0) * w_c * s_x / s_y``,
the two parts QClips of x and the sum one QAdd whose second multiplier is per channel
(both on one shift, ``intmath.aligned_multipliers``; a negative slope keeps its sign).
"""

from __future__ import annotations

import numpy as np
import onnx

from simulator.arith import fixedpoint as fp
from simulator.arith.intmath import aligned_multipliers
from stages.convert.compute import _into_quantizer, _out
from stages.convert.graph import Converter, QTensor
from stages.convert.rules import _bits, _mult, _req, check_ratio
from stages.onnx_builder import DOMAIN


def max_min(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """Max / Min of two integer tensors with an output quantizer; else a float island."""
    ins, spec = [c.qt.get(n) for n in node.input], _out(c, k, node)
    if spec is None or len(ins) != 2 or any(q is None or q.scale.size != 1 for q in ins):
        return False
    a, b = (_at_scale(c, q, float(spec[0]), spec[1]) for q in ins)
    sign = 1 if node.op_type == "Max" else -1
    one = c.const("one", np.ones(1, np.int64))
    first, second = (b, a) if sign == 1 else (a, b)
    diff, relu = f"{node.output[0]}#diff", f"{node.output[0]}#relu"
    wide = "int16" if spec[1] == "int8" else "int32"
    c.emit("QAdd", [first, second, one, c.const("minus", -np.ones(1, np.int64)),
                    c.const("zero", np.zeros(1, np.int64))], [diff], domain=DOMAIN,
           **_req(c, out_dtype=wide), relu=0)  # fmt: skip
    c.emit("QClip", [diff], [relu], domain=DOMAIN, lo=0, hi=int(np.iinfo(wide).max))
    mb = c.const("sign", np.full(1, sign, np.int64))
    ins = [a, relu, one, mb, c.const("zero", np.zeros(1, np.int64))]
    return _into_quantizer(c, spec, "QAdd", ins, **_req(c, out_dtype=spec[1]), relu=0)


def _at_scale(c: Converter, q: QTensor, scale: float, dtype: str) -> str:
    """``q``'s integers at ``scale`` in ``dtype`` (as they are when they already are)."""
    if float(q.scale) == scale and q.dtype == dtype:
        return q.name
    m, s = _mult(c, "align", float(q.scale) / scale)
    out = f"{q.name}#at{len(c.nodes)}"
    c.emit("QRequant", [q.name, m, s], [out], domain=DOMAIN, **_req(c, out_dtype=dtype))
    return out


def prelu(c: Converter, k: int, node: onnx.NodeProto) -> bool:
    """PRelu of an integer tensor with a constant slope and an output quantizer."""
    x, spec = c.qt.get(node.input[0]), _out(c, k, node)
    slope = c.inits.get(node.input[1])
    if x is None or spec is None or slope is None or x.scale.size != 1:
        return False
    r_pos = float(x.scale) / float(spec[0])
    r_neg = r_pos * slope.astype(np.float64)
    check_ratio(c, np.abs(r_neg), "prelu")
    (m_pos, m_neg), shift = aligned_multipliers(
        [r_pos, np.where(r_neg == 0, 1.0, np.abs(r_neg))], _bits(c), c.settings.rounding
    )
    m_neg = np.sign(r_neg).astype(np.int64) * m_neg
    qmin, qmax = fp.qrange(x.dtype)
    pos, neg = f"{node.output[0]}#pos", f"{node.output[0]}#neg"
    c.emit("QClip", [x.name], [pos], domain=DOMAIN, lo=0, hi=qmax)
    c.emit("QClip", [x.name], [neg], domain=DOMAIN, lo=qmin, hi=0)
    ins = [pos, neg, c.const("ma", np.atleast_1d(m_pos)), c.const("mb", m_neg),
           c.const("shift", np.atleast_1d(shift).astype(np.int64))]  # fmt: skip
    return _into_quantizer(c, spec, "QAdd", ins, **_req(c, out_dtype=spec[1]), relu=0)
