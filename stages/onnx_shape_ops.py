"""ONNX rules for the shape, layout, pooling and reduction aten ops (opset 21).

Same rule contract as :mod:`stages.onnx_ops` (``rule(b, node) -> str | list[str]``, ``b``
a :class:`stages.onnx_builder.GraphBuilder`); these ops move or select values (exact under
any scale) or pool / reduce them, and read the traced shapes to match torch's sizes.
"""

from __future__ import annotations

import numpy as np
import torch

aten = torch.ops.aten
INT64_MAX = 2**63 - 1


def widen(v, n: int) -> list[int]:
    """An int or short list widened to ``n`` spatial dims."""
    v = [v] if isinstance(v, int) else list(v)
    return v * n if len(v) == 1 else v


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
        k, s = widen(a["kernel_size"], n), widen(a["stride"] or a["kernel_size"], n)
        d, pad = widen(a.get("dilation", 1), n), widen(a["padding"], n)
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


def _adaptive(op: str, global_op: str, uneven_pool):
    """Global pooling for a 1x1 output; an exact AveragePool/MaxPool when sizes divide;
    else per-window pools joined (:func:`stages.onnx_ops_more.uneven_pool`)."""

    def rule(b, node):
        a = b.args(node)
        size, out = b.shape(a["self"])[2:], list(a["output_size"])
        x = b.arg(a["self"])
        if all(o == 1 for o in out):
            y = b.emit(global_op, [x])
        elif all(isinstance(s, int) and o and s % o == 0 for s, o in zip(size, out, strict=True)):
            k = [s // o for s, o in zip(size, out, strict=True)]
            y = b.emit(op, [x], kernel_shape=k, strides=k)
        elif all(isinstance(s, int) for s in size):
            y = uneven_pool(b, x, op, list(size), out)
        else:
            raise b.fail(f"adaptive pooling of a dynamic size {list(size)}",
                         hint="pool inputs of a static spatial size")  # fmt: skip
        return b.first_of(node, y)

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
    """Expand broadcasts: a dim kept from the input (symbolic batch too) is written as 1.

    A new dim that is the batch (a class token ``cls.expand(x.shape[0], -1, -1)``) is read
    from a graph input at run time, as exporters do: ``Shape(input)[0:1]`` concatenated
    with the static dims, so the exported graph keeps its dynamic batch."""
    src = node.args[0]
    in_shape, out = b.shape(src), b.out_shape(node)
    shape: list[int | str] = []
    for i, d in enumerate(out):
        j = i - (len(out) - len(in_shape))
        if isinstance(d, int):
            shape.append(d)
        elif j >= 0 and str(in_shape[j]) == str(d):
            shape.append(1)
        elif d == "1*batch":
            shape.append(d)
        else:
            raise b.fail(f"expand to a new dynamic dim {d}", hint="expand static dims only")
    if "1*batch" not in shape:
        return b.emit("Expand", [b.arg(src), b.ints(shape)])
    parts = [b.batch_size() if d == "1*batch" else b.ints([d]) for d in shape]
    return b.emit("Expand", [b.arg(src), b.emit("Concat", parts, axis=0)])


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


def _roll(b, node):
    """torch.roll has no ONNX op: per shifted dim, a Gather of the rotated positions
    (``(arange(n) - shift) mod n``): exact data movement under any scale."""
    a = b.args(node)
    x, shape = b.arg(a["self"]), b.shape(a["self"])
    dims = list(a.get("dims") or [])
    if not dims:
        raise b.fail("roll without dims (over the flattened tensor)", hint="give dims")
    for shift, dim in zip(list(a["shifts"]), dims, strict=True):
        n = shape[dim]
        if not isinstance(n, int):
            raise b.fail("roll along a dynamic dim", hint="roll static dims only")
        x = b.emit("Gather", [x, b.ints((np.arange(n) - shift) % n)], axis=dim)
    return x if x != b.arg(a["self"]) else b.emit("Identity", [x])


def _index(b, node):
    """x[..., idx] with one integer index tensor, after any number of whole dims (``None``:
    swin's ``table[idx]``, levit's ``biases[:, idx]``): Gather on that dim."""
    a = b.args(node)
    indices = list(a["indices"])
    axis = next((k for k, i in enumerate(indices) if i is not None), None)
    if axis is None or any(i is not None for i in indices[axis + 1 :]):
        raise b.fail("indexing with several index tensors", hint="index one dim")
    if not isinstance(indices[axis], torch.fx.Node):
        raise b.fail("indexing with a Python value", hint="index with an integer tensor")
    return b.emit("Gather", [b.arg(a["self"]), b.arg(indices[axis])], axis=axis)


def _getitem(b, node):
    """Pick one output of a multi-output op; an Identity so the item has its own node."""
    src, idx = node.args
    return b.emit("Identity", [b.item(src, idx)])
