"""Table (LUT) ops: pre_export turns each into a fixed-point ``qparity.Lut`` (int8 input:
256 entries computed with the op itself; int16: a segmented table), which convert keeps
and compile runs as one LUT instruction. Without its quantizers around it, the op stays
its float ONNX op (a float island)."""

from __future__ import annotations

import torch

from simulator.program.isa import Op
from stages.convert.rules import table
from stages.onnx_ops import _gelu, _leaky_relu, _rsqrt, _silu, _unary
from stages.ops.entry import Category, OpEntry

aten = torch.ops.aten


def lut(name: str, targets: tuple, rule, onnx_ops: tuple[str, ...], doc: str = "") -> OpEntry:
    """A table op: its aten targets and float ONNX rule; the rest is the same for all."""
    return OpEntry(
        name,
        Category.LUT,
        targets,
        rule,
        onnx_ops,
        (("qparity.Lut", table),),
        (Op.LUT,),
        table_op="Lut",
        doc=doc,
    )


def _elu(b, node):
    """ONNX Elu has alpha only: torch's ``scale`` and ``input_scale`` must be 1."""
    a = b.args(node)
    if a["scale"] != 1 or a["input_scale"] != 1:
        raise b.fail("elu with scale or input_scale other than 1", hint="use nn.ELU(alpha)")
    return b.emit("Elu", [b.arg(a["self"])], alpha=float(a["alpha"]))


ENTRIES = (
    lut("sigmoid", (aten.sigmoid.default,), _unary("Sigmoid"), ("Sigmoid",)),
    lut("tanh", (aten.tanh.default,), _unary("Tanh"), ("Tanh",)),
    lut("exp", (aten.exp.default,), _unary("Exp"), ("Exp",)),
    lut("log", (aten.log.default,), _unary("Log"), ("Log",)),
    lut("gelu", (aten.gelu.default,), _gelu, ("Gelu",), "erf and tanh forms"),
    lut("silu", (aten.silu.default,), _silu, ("Mul", "Sigmoid"), "float form x * sigmoid(x)"),
    lut("hardswish", (aten.hardswish.default,), _unary("HardSwish"), ("HardSwish",)),
    lut("leaky_relu", (aten.leaky_relu.default,), _leaky_relu, ("LeakyRelu",)),
    lut("abs", (aten.abs.default,), _unary("Abs"), ("Abs",)),
    lut("neg", (aten.neg.default,), _unary("Neg"), ("Neg",)),
    lut(
        "hardsigmoid",
        (aten.hardsigmoid.default,),
        _unary("HardSigmoid", alpha=1.0 / 6.0, beta=0.5),
        ("HardSigmoid",),
    ),
    lut("reciprocal", (aten.reciprocal.default,), _unary("Reciprocal"), ("Reciprocal",)),
    lut("sqrt", (aten.sqrt.default,), _unary("Sqrt"), ("Sqrt",)),
    lut("rsqrt", (aten.rsqrt.default,), _rsqrt, ("Reciprocal", "Sqrt")),
    lut("elu", (aten.elu.default,), _elu, ("Elu",), "alpha; scale and input_scale 1"),
)
