"""The quantizers the chain inserts (no aten target of their own): QuantizeLinear and
DequantizeLinear of qat.onnx."""

from __future__ import annotations

from simulator.program.isa import Op
from stages.convert.rules import dequantize, quantize
from stages.ops.entry import OpEntry

ENTRIES = (
    OpEntry(
        "quantize",
        None,
        onnx_ops=("QuantizeLinear", "qparity.QuantizeLinear"),
        convert=(("QuantizeLinear", quantize), ("qparity.QuantizeLinear", quantize)),
        instructions=(Op.QUANTIZE, Op.REQUANT),
        doc="a weight: integer constants; an activation: reused or rescaled",
    ),
    OpEntry(
        "dequantize",
        None,
        onnx_ops=("DequantizeLinear",),
        convert=(("DequantizeLinear", dequantize),),
        instructions=(Op.DEQUANTIZE,),
        doc="no node: the output is known to be the integers times the scale",
    ),
)
