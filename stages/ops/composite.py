"""Composite ops the BPU decomposes (softmax, layer norm; int16 inside), attention, and
batch norm (folded into the conv before it at prepare, else a float island)."""

from __future__ import annotations

import torch

from simulator.program.isa import Op
from stages.convert.rules import table
from stages.onnx_ops import _attention, _batch_norm, _layer_norm, _softmax
from stages.onnx_ops_more import _einsum, _group_norm, _log_softmax
from stages.ops.entry import Category, OpEntry

aten = torch.ops.aten

ENTRIES = (
    OpEntry(
        "softmax",
        Category.COMPOSITE,
        (aten.softmax.int, aten._softmax.default),
        _softmax,
        ("Softmax",),
        (("qparity.Softmax", table),),
        (Op.SOFTMAX,),
        table_op="Softmax",
        doc="max-subtract, exp table, sum, reciprocal table",
    ),
    OpEntry(
        "layer_norm",
        Category.COMPOSITE,
        (aten.layer_norm.default,),
        _layer_norm,
        ("LayerNormalization",),
        (("qparity.LayerNorm", table),),
        (Op.LAYERNORM,),
        table_op="LayerNorm",
        activation_inputs=1,
        doc="over the last axis; integer mean/variance, rsqrt table",
    ),
    OpEntry(
        "attention",
        Category.COMPOSITE,
        (aten.scaled_dot_product_attention.default,),
        _attention,
        ("MatMul", "Transpose", "Mul", "Add", "Where", "Softmax"),
        (),
        (Op.CPU,),
        doc="no table form: write matmul + softmax for the BPU",
    ),
    OpEntry(
        "batch_norm",
        Category.COMPUTE,
        (aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default),
        _batch_norm,
        ("BatchNormalization",),
        (),
        (Op.CPU,),
        activation_inputs=1,
        doc="folded into the conv before it at prepare; alone: a float island",
    ),
    OpEntry(
        "log_softmax",
        Category.COMPUTE,
        (aten.log_softmax.int, aten._log_softmax.default),
        _log_softmax,
        ("LogSoftmax",),
        (),
        (Op.CPU,),
        doc="any dim; no integer form at convert",
    ),
    OpEntry(
        "group_norm",
        Category.COMPUTE,
        (aten.group_norm.default,),
        _group_norm,
        ("Reshape", "InstanceNormalization", "Mul", "Add"),
        (),
        (Op.CPU,),
        activation_inputs=1,
        doc="InstanceNormalization over [N, G, -1] and the per-channel affine",
    ),
    OpEntry(
        "einsum",
        Category.COMPUTE,
        (aten.einsum.default,),
        _einsum,
        ("Einsum",),
        (),
        (Op.CPU,),
    ),
)
