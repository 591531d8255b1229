"""Per-aten-op translation to ONNX (opset 21): the export rules the op table
(:mod:`stages.ops`) gives its entries.

A rule is ``rule(b, node) -> str | list[str]``: it reads the fx node's schema-named
arguments (``b.args(node)``), emits ONNX nodes through the builder ``b``
(:class:`stages.onnx_builder.GraphBuilder`) and returns the name of its output tensor (a
list for multi-output ops). Returning an input's name unchanged means "identity, folded
away". Where ONNX semantics differ from torch the rule says so and compensates.

This module holds the weighted, element-wise, activation, normalization, resampling and
attention rules; the shape, layout, pooling and reduction rules are in
:mod:`stages.onnx_shape_ops`. :func:`stages.ops.onnx_rules` is the aten target -> rule
table.
"""

from __future__ import annotations

import numpy as np
import torch

from stages.onnx_builder import elem_type
from stages.onnx_shape_ops import widen

aten = torch.ops.aten


# -- weighted ops -----------------------------------------------------------------------
def _conv(b, node):
    """Conv; ``padding="same"`` is written out as torch pads it (extra pad at the end)."""
    a = b.args(node)
    n = len(b.shape(a["weight"])) - 2
    pads, dil = a["padding"], widen(a["dilation"], n)
    if isinstance(pads, str):
        kernel = b.shape(a["weight"])[2:]
        total = [0 if pads == "valid" else d * (k - 1) for d, k in zip(dil, kernel, strict=True)]
        begin = [t // 2 for t in total]
        pads = begin + [t - s for t, s in zip(total, begin, strict=True)]
    else:
        pads = widen(pads, n) * 2
    inputs = [b.arg(a["input"]), b.arg(a["weight"])] + ([b.arg(a["bias"])] if a["bias"] else [])
    return b.emit(
        "Conv", inputs, group=a["groups"], dilations=dil, pads=pads, strides=widen(a["stride"], n)
    )


def _linear(b, node):
    """Gemm(transB=1) for 2-D input, else MatMul with the transposed weight + Add."""
    a = b.args(node)
    x, w = b.arg(a["input"]), b.arg(a["weight"])
    bias = [b.arg(a["bias"])] if a["bias"] is not None else []
    if b.rank(a["input"]) == 2:
        return b.emit("Gemm", [x, w, *bias], transB=1)
    y = b.emit("MatMul", [x, b.emit("Transpose", [w], perm=[1, 0])])
    return b.emit("Add", [y, *bias]) if bias else y


# -- element-wise ----------------------------------------------------------------------
def _binary(op: str):
    def rule(b, node):
        a = b.args(node)
        other = a["other"]
        alpha = a.get("alpha", 1)
        y = b.arg(other, like=node)
        if alpha != 1:  # torch: self + alpha * other
            y = b.emit("Mul", [y, b.arg(alpha, like=node)])
        if a.get("rounding_mode") is not None:
            raise b.fail(f"div with rounding_mode={a['rounding_mode']!r}")
        x = _promoted(b, node, a["self"], b.arg(a["self"], like=node))
        return b.emit(op, [x, _promoted(b, node, other, y)])

    return rule


def _promoted(b, node, src, name: str) -> str:
    """``name`` cast to the node's dtype when its tensor ``src`` has another (torch promotes
    an int64 mask times a float tensor; ONNX needs both of one type)."""
    if not isinstance(src, torch.fx.Node) or b.dtype(src) == b.dtype(node):
        return name
    return b.emit("Cast", [name], to=elem_type(b.dtype(node)))


def _unary(op: str, **attrs):
    return lambda b, node: b.emit(op, [b.arg(node.args[0])], **attrs)


def _unary_n(op: str):
    """An op over all tensor args in order (MatMul)."""
    return lambda b, node: b.emit(op, [b.arg(x) for x in node.args])


def _clip(lo_key: str, hi_key: str, lo=None, hi=None):
    """Clip with optional bounds (empty input name = unbounded)."""

    def rule(b, node):
        a = b.args(node)
        lo_v, hi_v = a.get(lo_key, lo), a.get(hi_key, hi)
        bounds = ["" if v is None else b.arg(v, like=node) for v in (lo_v, hi_v)]
        return b.emit("Clip", [b.arg(a["self"]), *bounds])

    return rule


def _leaky_relu(b, node):
    return b.emit("LeakyRelu", [b.arg(node.args[0])], alpha=float(b.args(node)["negative_slope"]))


def _prelu(b, node):
    """ONNX PRelu broadcasts the slope from the right: reshape [C] to [C, 1, ...]."""
    a = b.args(node)
    slope, rank = b.arg(a["weight"]), b.rank(a["self"])
    if b.numel(a["weight"]) > 1 and rank > 2:
        slope = b.emit("Reshape", [slope, b.ints([-1] + [1] * (rank - 2))])
    return b.emit("PRelu", [b.arg(a["self"]), slope])


def _rsqrt(b, node):
    return b.emit("Reciprocal", [b.emit("Sqrt", [b.arg(node.args[0])])])


def _silu(b, node):
    x = b.arg(node.args[0])
    return b.emit("Mul", [x, b.emit("Sigmoid", [x])])


def _gelu(b, node):
    return b.emit("Gelu", [b.arg(node.args[0])], approximate=b.args(node)["approximate"])


def _softmax(b, node):
    return b.emit("Softmax", [b.arg(node.args[0])], axis=b.args(node)["dim"])


def _layer_norm(b, node):
    """LayerNormalization over the last ``len(normalized_shape)`` axes."""
    a = b.args(node)
    shape = list(a["normalized_shape"])
    scale = b.arg_or(a["weight"], np.ones(shape, np.float32))
    bias = [b.arg(a["bias"])] if a["bias"] is not None else []
    return b.emit(
        "LayerNormalization",
        [b.arg(a["input"]), scale, *bias],
        axis=-len(shape),
        epsilon=float(a["eps"]),
    )


def _batch_norm(b, node):
    """Eval-mode BatchNormalization (running statistics)."""
    a = b.args(node)
    if a.get("training"):
        raise b.fail("batch_norm in training mode", hint="export the model in eval mode")
    c = b.shape(a["input"])[1]
    w = b.arg_or(a["weight"], np.ones(c, np.float32))
    bias = b.arg_or(a["bias"], np.zeros(c, np.float32))
    stats = [b.arg(a["running_mean"]), b.arg(a["running_var"])]
    y = b.emit("BatchNormalization", [b.arg(a["input"]), w, bias, *stats], epsilon=a["eps"])
    return b.first_of(node, y)


# -- resampling -------------------------------------------------------------------------
def _resize(mode: str):
    """Resize with torch's coordinate rule: nearest = asymmetric + floor; bilinear =
    pytorch_half_pixel (align_corners False) or align_corners. The scale is torch's (the
    given factor, else out/in) as float32, nudged by an ulp where ``floor(in * scale)``
    would miss torch's size. ONNX divides by the scale where torch multiplies by its
    inverse: for non-integer ratios coordinates can differ by an ulp (~1e-7 outputs)."""

    def rule(b, node):
        a = b.args(node)
        in_hw, out_hw = b.shape(a["input"])[2:], b.out_shape(node)[2:]
        factors = a.get("scale_factors") or [a.get("scales_h"), a.get("scales_w")]
        scales = [_scale(f or o / i, i, o) for f, i, o in zip(factors, in_hw, out_hw, strict=True)]
        sc = b.const(np.array([1.0, 1.0, *scales], np.float32))
        if mode == "nearest":
            attrs = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        else:
            ac = a["align_corners"]
            attrs = {
                "coordinate_transformation_mode": "align_corners" if ac else "pytorch_half_pixel"
            }
        return b.emit("Resize", [b.arg(a["input"]), "", sc], mode=mode, **attrs)

    return rule


def _scale(factor: float, size: int, out: int) -> np.float32:
    """float32 scale with ``floor(size * scale) == out`` in float32 (onnxruntime) and in
    float64 (onnx shape inference) arithmetic."""
    s = np.float32(factor)
    for _ in range(8):
        sizes = (np.floor(np.float32(size) * s), np.floor(float(size) * float(s)))
        if min(sizes) >= out:
            break
        s = np.nextafter(s, np.float32(np.inf))
    return s


def _grid_sample(b, node):
    """GridSample; torch's integer interpolation / padding modes mapped to ONNX names."""
    a = b.args(node)
    modes = ["linear", "nearest", "cubic"]
    paddings = ["zeros", "border", "reflection"]
    return b.emit(
        "GridSample",
        [b.arg(a["input"]), b.arg(a["grid"])],
        mode=modes[a["interpolation_mode"]],
        padding_mode=paddings[a["padding_mode"]],
        align_corners=int(a["align_corners"]),
    )


# -- lookup and attention ---------------------------------------------------------------
def _embedding(b, node):
    """Row lookup: Gather on axis 0 of the weight."""
    a = b.args(node)
    return b.emit("Gather", [b.arg(a["weight"]), b.arg(a["indices"])], axis=0)


def _attention(b, node):
    """softmax(q @ k^T * scale + mask) @ v, scale defaulting to 1/sqrt(E)."""
    a = b.args(node)
    if a["dropout_p"]:
        raise b.fail("scaled_dot_product_attention with dropout_p > 0")
    q, k, v = (b.arg(a[n]) for n in ("query", "key", "value"))
    rank, (L, S) = b.rank(a["query"]), (b.shape(a["query"])[-2], b.shape(a["key"])[-2])
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scale = a["scale"] if a["scale"] is not None else 1 / np.sqrt(b.shape(a["query"])[-1])
    s = b.emit("MatMul", [q, b.emit("Transpose", [k], perm=perm)])
    s = b.emit("Mul", [s, b.const(np.array(scale, np.float32))])
    if a["is_causal"]:
        mask = np.triu(np.full((L, S), -np.inf, np.float32), 1)
        s = b.emit("Add", [s, b.const(mask)])
    if a["attn_mask"] is not None:
        m = b.arg(a["attn_mask"])
        if b.dtype(a["attn_mask"]) == torch.bool:
            m = b.emit("Where", [m, b.const(np.float32(0)), b.const(np.float32(-np.inf))])
        s = b.emit("Add", [s, m])
    return b.emit("MatMul", [b.emit("Softmax", [s], axis=-1), v])
