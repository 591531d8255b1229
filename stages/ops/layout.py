"""Layout and selection ops: the same op on the integers, under the input's scale
(compile runs them as LAYOUT data movement); concat requantizes its inputs to one scale."""

from __future__ import annotations

import operator

import torch

from simulator.program.isa import Op
from stages.convert.compute import concat
from stages.convert.rules import passthrough
from stages.onnx_ops_more import _pixel_shuffle, _repeat, _stack
from stages.onnx_shape_ops import (
    _cat,
    _expand,
    _flatten,
    _getitem,
    _identity,
    _index,
    _pad,
    _permute,
    _reshape,
    _roll,
    _select,
    _slice,
    _split,
    _squeeze,
    _unsqueeze,
)
from stages.ops.entry import Category, OpEntry, conv_rules, per_target

aten = torch.ops.aten
P = Category.PASSTHROUGH

_RESHAPE, _RESHAPE_RULES = per_target(
    (
        (aten.view.default, aten.reshape.default, aten.view_as.default, aten.reshape_as.default),
        _reshape,
    ),  # fmt: skip
    ((aten.flatten.using_ints,), _flatten),
    ((aten.unflatten.int,), _reshape),
    ((aten.squeeze.dim, aten.squeeze.dims), _squeeze),
    ((aten.unsqueeze.default,), _unsqueeze),
    ((aten.expand.default,), _expand),
)
_SLICE, _SLICE_RULES = per_target(
    ((aten.slice.Tensor,), _slice),
    ((aten.select.int,), _select),
    ((aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default), _split),
    ((aten.narrow.default,), _slice),
    ((aten.index.Tensor,), _index),
    ((operator.getitem,), _getitem),
)
_RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand")
_SLICES = ("Slice", "Gather", "Split", "Identity")

ENTRIES = (
    OpEntry(
        "cat",
        Category.COMPUTE,
        (aten.cat.default, aten.concat.default),
        _cat,
        ("Concat",),
        (("Concat", concat),),
        (Op.LAYOUT, Op.REQUANT),
        doc="inputs on another scale are requantized to the output's first",
    ),
    OpEntry(
        "pad",
        P,
        (aten.pad.default, aten.constant_pad_nd.default),
        _pad,
        ("Pad",),
        (("Pad", passthrough),),
        (Op.LAYOUT,),
    ),
    OpEntry(
        "reshape",
        P,
        _RESHAPE,
        _RESHAPE_RULES,
        _RESHAPES,
        conv_rules(passthrough, *_RESHAPES),
        (Op.LAYOUT,),
    ),
    OpEntry(
        "permute",
        P,
        (aten.permute.default, aten.transpose.int, aten.t.default),
        _permute,
        ("Transpose",),
        (("Transpose", passthrough),),
        (Op.LAYOUT,),
    ),
    OpEntry(
        "roll",
        P,
        (aten.roll.default,),
        _roll,
        ("Gather", "Identity"),
        (("Gather", passthrough),),
        (Op.LAYOUT,),
    ),
    OpEntry(
        "slice",
        P,
        _SLICE,
        _SLICE_RULES,
        _SLICES,
        conv_rules(passthrough, *_SLICES),
        (Op.LAYOUT,),
        doc="slice/select/split/chunk/narrow/index, and getitem of a multi-output op",
    ),
    OpEntry(
        "identity",
        P,
        (
            aten.contiguous.default,
            aten.clone.default,
            aten.dropout.default,
            aten.detach_.default,
            aten.alias.default,
        ),
        _identity,
        ("Identity",),
        (("Identity", passthrough),),
        (Op.LAYOUT,),
        doc="folded away at export",
    ),
    OpEntry(
        "stack",
        Category.COMPUTE,
        (aten.stack.default,),
        _stack,
        ("Unsqueeze", "Concat"),
        (("Concat", concat),),
        (Op.LAYOUT, Op.REQUANT),
        doc="Unsqueeze each input, then Concat (each requantized to the output's scale)",
    ),
    OpEntry(
        "repeat",
        P,
        (aten.repeat.default,),
        _repeat,
        ("Unsqueeze", "Expand", "Reshape", "Identity"),
        conv_rules(passthrough, "Unsqueeze", "Expand", "Reshape", "Identity"),
        (Op.LAYOUT,),
        doc="per repeated dim: Unsqueeze, Expand, Reshape",
    ),
    OpEntry(
        "pixel_shuffle",
        P,
        (aten.pixel_shuffle.default,),
        _pixel_shuffle,
        ("Reshape", "Transpose"),
        conv_rules(passthrough, "Reshape", "Transpose"),
        (Op.LAYOUT,),
    ),
)
