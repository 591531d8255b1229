"""ONNX rules of the ops #18 item 3 added (same contract as :mod:`stages.onnx_ops`).

Each is written with ONNX ops the later stages already know where that is exact (layout
ops run on integers); the others (GroupNormalization as InstanceNormalization, ...) have
no integer form at convert and run as float islands on the board's CPU side.
"""

from __future__ import annotations

import numpy as np
import torch

from stages.onnx_shape_ops import target_shape

aten = torch.ops.aten


def _group_norm(b, node):
    """x [N, C, ...] -> [N, G, -1], InstanceNormalization over the last axis, back to
    x's shape, then the per-channel affine (weight, bias reshaped to [C, 1, ...])."""
    a = b.args(node)
    x, shape, groups = b.arg(a["input"]), b.shape(a["input"]), a["num_groups"]
    y = b.emit("Reshape", [x, b.ints([0, groups, -1])])
    ones, zeros = np.ones(groups, np.float32), np.zeros(groups, np.float32)
    y = b.emit("InstanceNormalization", [y, b.const(ones), b.const(zeros)], epsilon=a["eps"])
    y = b.emit("Reshape", [y, b.ints(target_shape(shape, shape))])
    per_channel = b.ints([-1] + [1] * (len(shape) - 2))
    if a["weight"] is not None:
        y = b.emit("Mul", [y, b.emit("Reshape", [b.arg(a["weight"]), per_channel])])
    if a["bias"] is not None:
        y = b.emit("Add", [y, b.emit("Reshape", [b.arg(a["bias"]), per_channel])])
    return y


def more_rules() -> dict:
    """aten target -> rule, for the ops of this module."""
    return {
        aten.group_norm.default: _group_norm,
    }
