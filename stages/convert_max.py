"""maximum / minimum on integers, from instructions the BPU has (convert_rules formulas).

Both inputs are requantized to the output quantizer's scale (the rounding is monotonic, so
``max(round(a), round(b)) == round(max(a, b))`` on the requantized values), then
``max(a, b) = a + relu(b - a)`` and ``min(a, b) = a - relu(a - b)``: the difference one
width up (int8 -> int16, int16 -> int32: it never overflows), the relu a QClip, the sum a
QAdd into the output dtype (the result is one of the inputs, so it never saturates).
"""

from __future__ import annotations

import numpy as np
import onnx

from stages.convert_compute import _into_quantizer, _out
from stages.convert_graph import Converter, QTensor
from stages.convert_rules import _mult, _req
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


MAX_MIN = {("", "Max"): max_min, ("", "Min"): max_min}
