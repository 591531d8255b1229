"""Element-wise ops and matmul: arithmetic (the output gets its own quantizer) and the
clipping activations (relu, relu6, clamp: exact on the input's integers)."""

from __future__ import annotations

import torch

from simulator.program.isa import Op
from stages.convert.compute import add, matmul, mul
from stages.convert.more import max_min, prelu
from stages.convert.rules import clip
from stages.onnx_ops import _binary, _clip, _prelu, _unary, _unary_n
from stages.onnx_ops_more import _max_min, _pow
from stages.ops.entry import Category, OpEntry, per_target

aten = torch.ops.aten
C = Category.COMPUTE

ENTRIES = (
    OpEntry(
        "matmul",
        C,
        (aten.matmul.default, aten.bmm.default, aten.mm.default),
        _unary_n("MatMul"),
        ("MatMul",),
        (("MatMul", matmul),),
        (Op.MATMUL, Op.LINEAR),
        doc="two activations: QMatMul; a constant right side: a linear layer",
    ),
    OpEntry(
        "add",
        C,
        (aten.add.Tensor, aten.add.Scalar),
        _binary("Add"),
        ("Add", "Mul"),
        (("Add", add),),
        (Op.ADD,),
        fuses_accumulator=True,
        doc="scale-aligned; takes a conv/linear's int32 accumulator (fused conv + add)",
    ),
    OpEntry(
        "sub",
        C,
        (aten.sub.Tensor, aten.sub.Scalar),
        _binary("Sub"),
        ("Sub", "Mul"),
        (("Sub", add),),
        (Op.ADD,),
        fuses_accumulator=True,
        doc="QAdd with a negated multiplier",
    ),
    OpEntry(
        "mul",
        C,
        (aten.mul.Tensor, aten.mul.Scalar),
        _binary("Mul"),
        ("Mul",),
        (("Mul", mul),),
        (Op.MUL, Op.REQUANT),
        doc="by a positive constant: a requantize",
    ),
    OpEntry(
        "div",
        C,
        (aten.div.Tensor, aten.div.Scalar),
        _binary("Div"),
        ("Div",),
        (("Div", mul),),
        (Op.REQUANT,),
        doc="by a positive constant: a requantize; else a float island",
    ),
    OpEntry(
        "prelu",
        C,
        (aten.prelu.default,),
        _prelu,
        ("PRelu", "Reshape"),
        (("PRelu", prelu),),
        (Op.CLIP, Op.ADD),
        activation_inputs=1,
        doc="relu(x) and min(x, 0) as QClips, summed by one QAdd with per-channel slopes",
    ),
    OpEntry(
        "maximum",
        C,
        (aten.maximum.default,),
        _max_min("Max"),
        ("Max",),
        (("Max", max_min),),
        (Op.ADD, Op.CLIP),
        doc="both inputs at the output scale, then a + relu(b - a)",
    ),
    OpEntry(
        "minimum",
        C,
        (aten.minimum.default,),
        _max_min("Min"),
        ("Min",),
        (("Min", max_min),),
        (Op.ADD, Op.CLIP),
        doc="both inputs at the output scale, then a - relu(a - b)",
    ),
    OpEntry(
        "pow",
        C,
        (aten.pow.Tensor_Scalar,),
        _pow,
        ("Mul", "Pow"),
        (),
        (Op.MUL, Op.CPU),
        doc="x ** 2: Mul(x, x), an integer QMul; other exponents Pow, a float island",
    ),
)

_CLIPS, _CLIP_RULES = per_target(
    ((aten.clamp.default,), _clip("min", "max")),
    ((aten.hardtanh.default,), _clip("min_val", "max_val")),
)
P = Category.PASSTHROUGH
ENTRIES += (
    OpEntry(
        "relu", P, (aten.relu.default,), _unary("Relu"), ("Relu",), (("Relu", clip),), (Op.CLIP,)
    ),
    OpEntry(
        "relu6",
        P,
        (aten.relu6.default,),
        _clip("min", "max", 0.0, 6.0),
        ("Clip",),
        (("Clip", clip),),
        (Op.CLIP,),
    ),
    OpEntry(
        "clamp",
        P,
        _CLIPS,
        _CLIP_RULES,
        ("Clip",),
        (("Clip", clip),),
        (Op.CLIP,),
        doc="clamp and hardtanh: bounds in input steps",
    ),
)
