"""ONNX rules of the ops #18 item 3 added (same contract as :mod:`stages.onnx_ops`; the
op table :mod:`stages.ops` names them).

Each is written with ONNX ops the later stages already know where that is exact (layout
ops run on integers); the others (GroupNormalization as InstanceNormalization, ...) have
no integer form at convert and run as float islands on the board's CPU side.
"""

from __future__ import annotations

import numpy as np
import torch

from stages.onnx_shape_ops import target_shape, widen

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


def _conv_transpose(b, node):
    """ConvTranspose with torch's stride, padding (both ends), output_padding and
    dilation; groups as one ConvTranspose per group (onnx's reference evaluator, which
    runs the island on the board, mishandles group > 1) joined by a Concat."""
    a = b.args(node)
    n, g = len(b.shape(a["weight"])) - 2, a["groups"]
    ins = [b.arg(a["input"]), b.arg(a["weight"])]
    ins += [b.arg(a["bias"])] if a["bias"] is not None else []
    attrs = {"strides": widen(a["stride"], n), "pads": widen(a["padding"], n) * 2,
             "output_padding": widen(a["output_padding"], n), "dilations": widen(a["dilation"], n)}  # fmt: skip
    if g == 1:
        return b.emit("ConvTranspose", ins, **attrs)
    parts = [
        b.emit("Split", [t], n_out=g, axis=int(i == 0), num_outputs=g) for i, t in enumerate(ins)
    ]
    ys = [b.emit("ConvTranspose", list(group), **attrs) for group in zip(*parts, strict=True)]
    return b.emit("Concat", ys, axis=1)


def nearest(fallback):
    """Nearest upsampling by whole factors as layout ops every later stage runs on
    integers: [N, C, H, W] -> [N, C, H, 1, W, 1], Expand by the factors, Reshape to
    [N, C, H*sh, W*sw] (torch's nearest: ``out[i] = in[floor(i / s)]``). Other ratios:
    the ``fallback`` rule (Resize, a float island)."""

    def rule(b, node):
        a = b.args(node)
        shape, out = b.shape(a["input"]), b.out_shape(node)
        if not all(isinstance(d, int) for d in shape[1:]) or any(
            o % i for i, o in zip(shape[2:], out[2:], strict=True)
        ):
            return fallback(b, node)
        _, c, h, w = shape
        sh, sw = out[2] // h, out[3] // w
        y = b.emit("Reshape", [b.arg(a["input"]), b.ints([0, c, h, 1, w, 1])])
        y = b.emit("Expand", [y, b.ints([1, 1, 1, sh, 1, sw])])
        return b.emit("Reshape", [y, b.ints([0, c, h * sh, w * sw])])

    return rule


def _pixel_shuffle(b, node):
    """[N, C*r*r, H, W] -> [N, C, r, r, H, W] -> [N, C, H, r, W, r] -> [N, C, H*r, W*r]:
    layout ops, exact on integers."""
    a = b.args(node)
    _, c, h, w = b.shape(a["self"])
    r = a["upscale_factor"]
    y = b.emit("Reshape", [b.arg(a["self"]), b.ints([0, c // (r * r), r, r, h, w])])
    y = b.emit("Transpose", [y], perm=[0, 1, 4, 2, 5, 3])
    return b.emit("Reshape", [y, b.ints([0, c // (r * r), h * r, w * r])])


def _log_softmax(b, node):
    """LogSoftmax on any dim (a float island: no integer form at convert)."""
    return b.emit("LogSoftmax", [b.arg(node.args[0])], axis=b.args(node)["dim"])


def _max_min(op: str):
    """Element-wise Max / Min of two tensors (float islands: no integer form at convert)."""
    return lambda b, node: b.emit(op, [b.arg(a, like=node) for a in node.args[:2]])


def _pow(b, node):
    """x ** 2 as Mul(x, x), an integer QMul at convert; other exponents Pow (a float
    island)."""
    a = b.args(node)
    x = b.arg(a["self"])
    if a["exponent"] == 2:
        return b.emit("Mul", [x, x])
    return b.emit("Pow", [x, b.arg(a["exponent"], like=node)])


def _einsum(b, node):
    """Einsum with torch's equation (a float island: no integer form at convert)."""
    equation, tensors = node.args[0], node.args[1]
    return b.emit("Einsum", [b.arg(t) for t in tensors], equation=equation.replace(" ", ""))


def _repeat(b, node):
    """Tensor.repeat as layout ops exact on integers: per repeated dim d, Unsqueeze a
    new dim before it, Expand that dim to the count, Reshape the two into one."""
    a = b.args(node)
    x, shape, reps = b.arg(a["self"]), list(b.shape(a["self"])), list(a["repeats"])
    if len(reps) != len(shape) or reps[0] != 1 or not all(isinstance(d, int) for d in shape[1:]):
        raise b.fail("repeat over the batch dim or adding dims", hint="repeat the non-batch dims")
    for d, r in enumerate(reps):
        if r == 1:
            continue
        x = b.emit("Unsqueeze", [x, b.ints([d])])
        x = b.emit("Expand", [x, b.ints([1] * d + [r] + [1] * (len(shape) - d))])
        shape[d] *= r
        x = b.emit("Reshape", [x, b.ints([0] + shape[1:])])
    return x if x != b.arg(a["self"]) else b.emit("Identity", [x])


def _stack(b, node):
    """stack = Unsqueeze every input at dim, then Concat (convert's Concat requantizes
    each input to the output's scale)."""
    a = b.args(node)
    dim = a["dim"] % (b.rank(a["tensors"][0]) + 1)
    ins = [b.emit("Unsqueeze", [b.arg(t), b.ints([dim])]) for t in a["tensors"]]
    return b.emit("Concat", ins, axis=dim)


def uneven_pool(b, x: str, op: str, size: list[int], out: list[int]) -> str:
    """Adaptive pooling whose windows differ in size, one spatial axis at a time (both
    pools are separable): per output index i, the window ``[floor(i*n/o),
    ceil((i+1)*n/o))`` sliced out and pooled to length 1 (MaxPool / AveragePool with
    that kernel), the results joined by a Concat; an axis that divides is one pool."""
    for axis, (n, o) in enumerate(zip(size, out, strict=True), start=2):
        kernel = [1] * len(size)
        if n % o == 0:
            kernel[axis - 2] = n // o
            x = b.emit(op, [x], kernel_shape=kernel, strides=kernel)
            continue
        parts = []
        for i in range(o):
            start, end = i * n // o, -(-(i + 1) * n // o)
            kernel[axis - 2] = end - start
            part = b.emit("Slice", [x, b.ints([start]), b.ints([end]), b.ints([axis])])
            parts.append(b.emit(op, [part], kernel_shape=list(kernel)))
        x = b.emit("Concat", parts, axis=axis)
    return x
