"""Weighted ops: conv and linear (int8 per-channel weights, int32 accumulate), and the
transposed conv (no integer form: a float island with float weights)."""

from __future__ import annotations

import torch

from simulator.program.isa import Op
from stages.convert.compute import conv, gemm, matmul
from stages.onnx_ops import _conv, _linear
from stages.onnx_ops_more import _conv_transpose
from stages.ops.entry import Category, OpEntry

aten = torch.ops.aten
W = Category.WEIGHTED

ENTRIES = (
    OpEntry(
        "conv",
        W,
        (aten.conv1d.default, aten.conv2d.default, aten.conv2d.padding),
        _conv,
        ("Conv",),
        (("Conv", conv),),
        (Op.CONV,),
        doc="1d/2d, grouped, depthwise, dilated, padding='same'",
    ),
    OpEntry(
        "linear",
        W,
        (aten.linear.default,),
        _linear,
        ("Gemm", "MatMul", "Transpose", "Add"),
        (("Gemm", gemm), ("MatMul", matmul)),
        (Op.LINEAR,),
        doc="2-D input: Gemm; more dims: MatMul with the transposed weight (+ Add)",
    ),
    OpEntry(
        "conv_transpose",
        Category.COMPUTE,
        (aten.conv_transpose2d.input, aten.conv_transpose1d.default),
        _conv_transpose,
        ("ConvTranspose", "Concat"),
        (),
        (Op.CPU,),
        activation_inputs=1,
        doc="strided, padded, output_padding, grouped; float weights, a float island",
    ),
)
