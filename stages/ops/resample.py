"""Resampling and lookup: upsampling, grid_sample, embedding."""

from __future__ import annotations

import torch

from simulator.program.isa import Op
from stages.convert.rules import passthrough
from stages.onnx_ops import _embedding, _grid_sample, _resize
from stages.onnx_ops_more import nearest
from stages.ops.entry import Category, OpEntry, conv_rules

aten = torch.ops.aten

ENTRIES = (
    OpEntry(
        "resize",
        Category.COMPUTE,
        (aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default),
        _resize("linear"),
        ("Resize",),
        (),
        (Op.CPU,),
        doc="bilinear; torch's coordinate rule",
    ),
    OpEntry(
        "grid_sample",
        Category.COMPUTE,
        (aten.grid_sampler.default, aten.grid_sampler_2d.default),
        _grid_sample,
        ("GridSample",),
        (),
        (Op.CPU,),
    ),
    OpEntry(
        "embedding",
        Category.COMPUTE,
        (aten.embedding.default,),
        _embedding,
        ("Gather",),
        (("Gather", passthrough),),
        (Op.LAYOUT,),
        activation_inputs=0,
        doc="Gather rows of the quantized weight",
    ),
    OpEntry(
        "upsample_nearest",
        Category.PASSTHROUGH,
        (aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default),
        nearest(_resize("nearest")),
        ("Reshape", "Expand", "Resize"),
        conv_rules(passthrough, "Reshape", "Expand"),
        (Op.LAYOUT, Op.CPU),
        doc="whole factors: Reshape/Expand/Reshape on integers; other ratios a Resize island",
    ),
)
