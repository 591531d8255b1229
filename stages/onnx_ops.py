"""Per-aten-op translation to ONNX (opset 21): one rule per :data:`stages.layers.OP_TABLE` op.

A rule is ``rule(b, node) -> str | list[str]``: it reads the fx node's schema-named
arguments (``b.args(node)``), emits ONNX nodes through the builder ``b``
(:class:`stages.onnx_export.GraphBuilder`) and returns the name of its output tensor (a
list for multi-output ops). Returning an input's name unchanged means "identity, folded
away". Where ONNX semantics differ from torch the rule says so and compensates.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

aten = torch.ops.aten
INT64_MAX = 2**63 - 1


# -- weighted ops -----------------------------------------------------------------------
def _conv(b, node):
    """Conv; ``padding="same"`` is written out as torch pads it (extra pad at the end)."""
    a = b.args(node)
    n = len(b.shape(a["weight"])) - 2
    pads, dil = a["padding"], _n(a["dilation"], n)
    if isinstance(pads, str):
        kernel = b.shape(a["weight"])[2:]
        total = [0 if pads == "valid" else d * (k - 1) for d, k in zip(dil, kernel, strict=True)]
        begin = [t // 2 for t in total]
        pads = begin + [t - s for t, s in zip(total, begin, strict=True)]
    else:
        pads = _n(pads, n) * 2
    inputs = [b.arg(a["input"]), b.arg(a["weight"])] + ([b.arg(a["bias"])] if a["bias"] else [])
    return b.emit(
        "Conv", inputs, group=a["groups"], dilations=dil, pads=pads, strides=_n(a["stride"], n)
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


def _n(v, n: int) -> list[int]:
    """An int or short list widened to ``n`` spatial dims."""
    v = [v] if isinstance(v, int) else list(v)
    return v * n if len(v) == 1 else v


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
        return b.emit(op, [b.arg(a["self"], like=node), y])

    return rule


def _unary(op: str, **attrs):
    return lambda b, node: b.emit(op, [b.arg(node.args[0])], **attrs)


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
    scale = b.arg(a["weight"]) if a["weight"] is not None else b.const(np.ones(shape, np.float32))
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
    w = b.arg(a["weight"]) if a["weight"] is not None else b.const(np.ones(c, np.float32))
    bias = b.arg(a["bias"]) if a["bias"] is not None else b.const(np.zeros(c, np.float32))
    stats = [b.arg(a["running_mean"]), b.arg(a["running_var"])]
    y = b.emit("BatchNormalization", [b.arg(a["input"]), w, bias, *stats], epsilon=a["eps"])
    return [y, "", ""] if b.multi(node) else y


# -- pooling and reductions -------------------------------------------------------------
def _pool(op: str):
    """MaxPool/AveragePool matching torch's output size without ONNX ``ceil_mode``.

    torch's ceil mode drops a last window that would start in the end padding; ONNX's
    ceil formula (and onnx shape inference) keeps it. So ceil_mode is never written: the
    end pads grow until floor mode gives torch's traced size. Those extra cells are
    ignored by max and by ``count_include_pad=0``; with ``count_include_pad`` torch divides
    by the window clipped to the padded input, i.e. explicit zero padding (a Pad node)
    plus an average that does not count the extra cells.
    """

    def rule(b, node):
        a = b.args(node)
        n = b.rank(a["self"]) - 2
        k, s = _n(a["kernel_size"], n), _n(a["stride"] or a["kernel_size"], n)
        d, pad = _n(a.get("dilation", 1), n), _n(a["padding"], n)
        ins, outs = b.shape(a["self"])[2:], b.out_shape(node)[2:]
        extra = [
            max(0, (o - 1) * st + (kk - 1) * dd + 1 - (i + 2 * p))
            for i, o, kk, st, dd, p in zip(ins, outs, k, s, d, pad, strict=True)
        ]
        attrs = {"kernel_shape": k, "strides": s}
        x = b.arg(a["self"])
        if op == "MaxPool":
            attrs["dilations"] = d
        elif a.get("divisor_override") is not None:
            raise b.fail("avg_pool with divisor_override")
        elif a["count_include_pad"] and any(pad):
            x = b.emit("Pad", [x, b.ints([0, 0, *pad, 0, 0, *pad])], mode="constant")
            pad, attrs["count_include_pad"] = [0] * n, 0
        else:
            attrs["count_include_pad"] = int(a["count_include_pad"])
        attrs["pads"] = pad + [p + e for p, e in zip(pad, extra, strict=True)]
        return b.emit(op, [x], **attrs)

    return rule


def _adaptive(op: str, global_op: str):
    """Global pooling for a 1x1 output; an exact AveragePool/MaxPool when sizes divide."""

    def rule(b, node):
        a = b.args(node)
        size, out = b.shape(a["self"])[2:], list(a["output_size"])
        x = b.arg(a["self"])
        if all(o == 1 for o in out):
            y = b.emit(global_op, [x])
        elif all(isinstance(s, int) and o and s % o == 0 for s, o in zip(size, out, strict=True)):
            k = [s // o for s, o in zip(size, out, strict=True)]
            y = b.emit(op, [x], kernel_shape=k, strides=k)
        else:
            raise b.fail(
                f"adaptive pooling from {list(size)} to {out} has uneven windows",
                hint="use an output size that divides the input size, or 1x1",
            )
        return [y, ""] if b.multi(node) else y

    return rule


def _reduce(op: str):
    def rule(b, node):
        a = b.args(node)
        dims = a.get("dim")
        x = b.arg(a["self"])
        if not dims:  # mean.default / dim=None: all axes, no keepdim
            return b.emit(op, [x], keepdims=int(a.get("keepdim", False)))
        axes = [dims] if isinstance(dims, int) else list(dims)
        return b.emit(op, [x, b.ints(axes)], keepdims=int(a["keepdim"]))

    return rule


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


def _embedding(b, node):
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


def rules() -> dict:
    """aten target -> rule, for every op of :data:`stages.layers.OP_TABLE`."""
    max_pool, avg_pool = _pool("MaxPool"), _pool("AveragePool")
    table = {
        aten.conv1d.default: _conv, aten.conv2d.default: _conv, aten.conv2d.padding: _conv,
        aten.linear.default: _linear,
        aten.matmul.default: _unary_n("MatMul"), aten.bmm.default: _unary_n("MatMul"),
        aten.mm.default: _unary_n("MatMul"),
        aten.add.Tensor: _binary("Add"), aten.add.Scalar: _binary("Add"),
        aten.sub.Tensor: _binary("Sub"), aten.sub.Scalar: _binary("Sub"),
        aten.mul.Tensor: _binary("Mul"), aten.mul.Scalar: _binary("Mul"),
        aten.div.Tensor: _binary("Div"), aten.div.Scalar: _binary("Div"),
        aten.relu.default: _unary("Relu"),
        aten.relu6.default: _clip("min", "max", 0.0, 6.0),
        aten.hardtanh.default: _clip("min_val", "max_val"),
        aten.clamp.default: _clip("min", "max"),
        aten.leaky_relu.default: _leaky_relu, aten.prelu.default: _prelu,
        aten.sigmoid.default: _unary("Sigmoid"), aten.tanh.default: _unary("Tanh"),
        aten.exp.default: _unary("Exp"), aten.log.default: _unary("Log"),
        aten.sqrt.default: _unary("Sqrt"), aten.rsqrt.default: _rsqrt,
        aten.reciprocal.default: _unary("Reciprocal"),
        aten.gelu.default: _gelu, aten.silu.default: _silu,
        aten.hardswish.default: _unary("HardSwish"),
        aten.softmax.int: _softmax, aten._softmax.default: _softmax,
        aten.layer_norm.default: _layer_norm,
        aten.batch_norm.default: _batch_norm,
        aten._native_batch_norm_legit_no_training.default: _batch_norm,
        aten.max_pool2d.default: max_pool, aten.max_pool1d.default: max_pool,
        aten.avg_pool2d.default: avg_pool, aten.avg_pool1d.default: avg_pool,
        aten.adaptive_avg_pool2d.default: _adaptive("AveragePool", "GlobalAveragePool"),
        aten.adaptive_max_pool2d.default: _adaptive("MaxPool", "GlobalMaxPool"),
        aten.mean.dim: _reduce("ReduceMean"), aten.mean.default: _reduce("ReduceMean"),
        aten.sum.dim_IntList: _reduce("ReduceSum"),
        aten.upsample_nearest2d.vec: _resize("nearest"),
        aten.upsample_nearest2d.default: _resize("nearest"),
        aten.upsample_bilinear2d.vec: _resize("linear"),
        aten.upsample_bilinear2d.default: _resize("linear"),
        aten.grid_sampler.default: _grid_sample, aten.grid_sampler_2d.default: _grid_sample,
        aten.embedding.default: _embedding,
        aten.scaled_dot_product_attention.default: _attention,
    }  # fmt: skip
    return table | _shape_rules()


def _unary_n(op: str):
    """An op over all tensor args in order (MatMul)."""
    return lambda b, node: b.emit(op, [b.arg(x) for x in node.args])


def _getitem(b, node):
    """Pick one output of a multi-output op; an Identity so the item has its own node."""
    src, idx = node.args
    return b.emit("Identity", [b.item(src, idx)])


# -- layout and selection (exact under any scale) ---------------------------------------
def target_shape(in_shape, out_shape) -> list[int]:
    """ONNX Reshape target for a torch output shape that may hold symbolic dims.

    Static dims are written as is; a symbolic dim equal to the input's dim at the same
    index is 0 ("copy", e.g. the batch); one other symbolic dim becomes -1. Raises
    ValueError when more than one dim would be -1.
    """
    shape = []
    for i, d in enumerate(out_shape):
        if isinstance(d, int):
            shape.append(d)
        elif i < len(in_shape) and not isinstance(in_shape[i], int) and str(in_shape[i]) == str(d):
            shape.append(0)
        else:
            shape.append(-1)
    if shape.count(-1) > 1:
        raise ValueError(f"{shape.count(-1)} dynamic dims in output shape {list(out_shape)}")
    return shape


def _reshape(b, node):
    """Reshape to the traced output shape (symbolic batch -> 0 or -1, see target_shape)."""
    src = node.args[0]
    try:
        shape = target_shape(b.shape(src), b.out_shape(node))
    except ValueError as e:
        raise b.fail(str(e), hint="keep a single dynamic (batch) dim per reshape") from e
    return b.emit("Reshape", [b.arg(src), b.ints(shape)])


def _flatten(b, node):
    """ONNX Flatten is 2-D ([prod(d[:axis]), prod(d[axis:])]): only torch's flatten(1)."""
    a = b.args(node)
    rank = b.rank(a["self"])
    if a["start_dim"] == 1 and a["end_dim"] % max(rank, 1) == rank - 1:
        return b.emit("Flatten", [b.arg(a["self"])], axis=1)
    return _reshape(b, node)


def _expand(b, node):
    """Expand broadcasts: a dim kept from the input (symbolic batch too) is written as 1."""
    src = node.args[0]
    in_shape, out = b.shape(src), b.out_shape(node)
    shape = []
    for i, d in enumerate(out):
        j = i - (len(out) - len(in_shape))
        if isinstance(d, int):
            shape.append(d)
        elif j >= 0 and str(in_shape[j]) == str(d):
            shape.append(1)
        else:
            raise b.fail(f"expand to a new dynamic dim {d}", hint="expand static dims only")
    return b.emit("Expand", [b.arg(src), b.ints(shape)])


def _squeeze(b, node):
    """torch ignores non-1 dims, ONNX rejects them: squeeze only the dims of size 1."""
    a = b.args(node)
    dims = a.get("dim", a.get("dims"))
    dims = [dims] if isinstance(dims, int) else list(dims)
    shape = b.shape(a["self"])
    axes = [d % len(shape) for d in dims if shape[d] == 1]
    if not axes:
        return b.arg(a["self"])  # a no-op in torch
    return b.emit("Squeeze", [b.arg(a["self"]), b.ints(axes)])


def _unsqueeze(b, node):
    return b.emit("Unsqueeze", [b.arg(node.args[0]), b.ints([b.args(node)["dim"]])])


def _permute(b, node):
    a, rank = b.args(node), b.rank(node.args[0])
    if node.target == aten.permute.default:
        perm = [d % rank for d in a["dims"]]
    elif node.target == aten.t.default:
        perm = [1, 0] if rank == 2 else [0]
    else:
        perm = list(range(rank))
        d0, d1 = a["dim0"] % rank, a["dim1"] % rank
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return b.emit("Transpose", [b.arg(node.args[0])], perm=perm)


def _slice(b, node):
    """Slice / narrow; start/end must be static (torch's INT64_MAX end is kept as is)."""
    a = b.args(node)
    if node.target == aten.narrow.default:
        start, end, step = a["start"], a["start"] + a["length"], 1
    else:
        start, end, step = a["start"] or 0, a["end"], a["step"]
        end = INT64_MAX if end is None else end
    if not all(isinstance(v, int) for v in (start, end, step)):
        raise b.fail("slice with symbolic bounds", hint="slice with constant bounds")
    starts, ends, axes, steps = (b.ints([v]) for v in (start, end, a["dim"], step))
    return b.emit("Slice", [b.arg(a["self"]), starts, ends, axes, steps])


def _select(b, node):
    a = b.args(node)
    index = b.const(np.array(a["index"], np.int64))
    return b.emit("Gather", [b.arg(a["self"]), index], axis=a["dim"])


def _split(b, node):
    """split / split_with_sizes / chunk: the sizes are read from the traced outputs."""
    a = b.args(node)
    dim = a["dim"]
    sizes = [int(shape[dim]) for shape in b.shapes(node)]
    return b.emit("Split", [b.arg(a["self"]), b.ints(sizes)], n_out=len(sizes), axis=dim)


def _cat(b, node):
    a = b.args(node)
    return b.emit("Concat", [b.arg(t) for t in a["tensors"]], axis=a["dim"])


def _pad(b, node):
    """torch pads (last dim first, begin/end pairs) -> ONNX [begins..., ends...]."""
    a = b.args(node)
    rank, pad = b.rank(a["self"]), list(a["pad"])
    begins, ends = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):
        begins[rank - 1 - k], ends[rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    mode = modes.get(a.get("mode", "constant"))
    if mode is None:
        raise b.fail(f"pad mode {a['mode']!r}")
    value = a.get("value") or 0.0
    inputs = [b.arg(a["self"]), b.ints(begins + ends)]
    if mode == "constant":
        inputs.append(b.const(np.array(value, np.float32)))
    return b.emit("Pad", inputs, mode=mode)


def _identity(b, node):
    """contiguous/clone/alias/detach/eval dropout: folded away (the input's tensor)."""
    a = b.args(node)
    if node.target == aten.dropout.default and a["train"] and a["p"] > 0:
        raise b.fail("dropout in training mode", hint="export the model in eval mode")
    return b.arg(node.args[0])


def _shape_rules() -> dict:
    reshape = [aten.view.default, aten.reshape.default, aten.unflatten.int]
    identity = [aten.contiguous.default, aten.clone.default, aten.dropout.default]
    identity += [aten.detach_.default, aten.alias.default]
    splits = [aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default]
    permutes = [aten.permute.default, aten.transpose.int, aten.t.default]
    table = {t: _reshape for t in reshape} | {t: _identity for t in identity}
    table |= {t: _split for t in splits} | {t: _permute for t in permutes}
    return table | {
        aten.flatten.using_ints: _flatten,
        aten.expand.default: _expand,
        aten.squeeze.dim: _squeeze,
        aten.squeeze.dims: _squeeze,
        aten.unsqueeze.default: _unsqueeze,
        aten.slice.Tensor: _slice,
        aten.narrow.default: _slice,
        aten.select.int: _select,
        aten.cat.default: _cat,
        aten.concat.default: _cat,
        aten.pad.default: _pad,
        aten.constant_pad_nd.default: _pad,
        operator.getitem: _getitem,
    }
