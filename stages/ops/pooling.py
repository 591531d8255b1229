"""Pooling and reductions."""

from __future__ import annotations

import torch

from simulator.program.isa import Op
from stages.convert.compute import avg_pool, reduce_mean
from stages.convert.rules import max_pool
from stages.onnx_ops_more import uneven_pool
from stages.onnx_shape_ops import _adaptive, _pool, _reduce
from stages.ops.entry import Category, OpEntry, per_target

aten = torch.ops.aten

_AVG, _AVG_RULES = per_target(
    ((aten.avg_pool2d.default,), _pool("AveragePool")),
    (
        (aten.adaptive_avg_pool2d.default,),
        _adaptive("AveragePool", "GlobalAveragePool", uneven_pool),
    ),
    ((aten.avg_pool1d.default,), _pool("AveragePool")),
)
_MAX, _MAX_RULES = per_target(
    ((aten.max_pool2d.default, aten.max_pool1d.default), _pool("MaxPool")),
    ((aten.adaptive_max_pool2d.default,), _adaptive("MaxPool", "GlobalMaxPool", uneven_pool)),
)

ENTRIES = (
    OpEntry(
        "avg_pool",
        Category.COMPUTE,
        _AVG,
        _AVG_RULES,
        ("AveragePool", "GlobalAveragePool", "Slice", "Concat"),
        (("AveragePool", avg_pool), ("GlobalAveragePool", reduce_mean)),
        (Op.AVGPOOL, Op.REDUCE_MEAN, Op.CPU),
        doc="ceil mode, uneven adaptive windows (Slice + pool + Concat): a float island",
    ),
    OpEntry(
        "mean",
        Category.COMPUTE,
        (aten.mean.dim, aten.mean.default),
        _reduce("ReduceMean"),
        ("ReduceMean",),
        (("ReduceMean", reduce_mean),),
        (Op.REDUCE_MEAN,),
    ),
    OpEntry(
        "sum",
        Category.COMPUTE,
        (aten.sum.dim_IntList,),
        _reduce("ReduceSum"),
        ("ReduceSum",),
        (("ReduceSum", reduce_mean),),
        (Op.REDUCE_SUM,),
    ),
    OpEntry(
        "max_pool",
        Category.PASSTHROUGH,
        _MAX,
        _MAX_RULES,
        ("MaxPool", "GlobalMaxPool", "Slice", "Concat"),
        (("MaxPool", max_pool),),
        (Op.MAXPOOL, Op.LAYOUT),
        doc="exact on integers; uneven adaptive windows: Slice + MaxPool + Concat",
    ),
)
