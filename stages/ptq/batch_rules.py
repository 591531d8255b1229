"""The batch-axis rules of :mod:`stages.ptq.generalize`: for each op, the axis of its
output that carries the batch, given the axis of its inputs (``Walk.axis``), and the
rewrite of a target that fixes the batch; :func:`aligned` for every op not in
:data:`RULES` (broadcasting and one-input ops)."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np
import onnx

from schemas.errors import StageError
from stages.ptq import shapes as sh
from stages.ptq.graph import attr

BATCH = "batch"
FIRST_AXIS = frozenset(
    {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
     "BatchNormalization", "InstanceNormalization", "DepthToSpace", "SpaceToDepth", "LRN"}
)  # fmt: skip
"""NCHW ops: the batch must be their input's axis 0, and stays the output's."""
REDUCE = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ArgMax", "ArgMin"})


@dataclass
class Walk:
    """The walk's state: static shapes and constants at batch ``b``, the batch axis of
    every tensor that carries it, and what the rewrites add."""

    shapes: dict[str, list[int]]
    consts: dict[str, np.ndarray]
    b: int
    x: str
    opset: int
    axis: dict[str, int] = field(default_factory=dict)
    inner: dict[str, int] = field(default_factory=dict)
    """Tensors whose batch axis holds more than the batch: the size of the dims merged
    after it (``[N*B, E]``: 1; ``[B*nW, ...]``: nW)."""
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def fail(self, node: onnx.NodeProto, why: str) -> StageError:
        return StageError(
            f"original: the model fixes the batch at {self.b} and {node.op_type} node "
            f"{node.name!r} cannot take another: {why}",
            where=f"{sh.FIELD} / node {node.name}",
            hint="export the model with a dynamic batch (dim 0), or rewrite that node; "
            f"{sh.FIELD} sets the other dims",
        )


def _rank(w: Walk, name: str) -> int:
    return len(w.shapes[name])


def aligned(node, data, w: Walk) -> int:
    """Broadcasting and one-input ops: the batch keeps its place counted from the right;
    constants must be 1 along it; no ``axis`` of the op may be the batch."""
    rank = _rank(w, node.output[0])
    qs = {w.axis[i] + rank - _rank(w, i) for i in data}
    if len(qs) != 1:
        raise w.fail(node, f"its inputs carry the batch on different axes {sorted(qs)}")
    q = qs.pop()
    for c in (i for i in node.input if i in w.consts and i not in data):
        j = q - (rank - w.consts[c].ndim)
        if j >= 0 and w.consts[c].shape[j] != 1:
            raise w.fail(node, f"constant {c!r} has {w.consts[c].shape[j]} on the batch axis")
    axis = attr(node, "axis")
    if axis is not None and (axis % rank == q or (node.op_type.startswith("Layer") and
                                                  axis % rank <= q)):  # fmt: skip
        raise w.fail(node, f"it works along axis {axis}, the batch")
    return q


def _first_axis(node, data, w: Walk) -> int:
    if w.axis[data[0]] != 0 or data[1:]:
        raise w.fail(node, "the batch is not its input's axis 0")
    return 0


def _reshape(node, data, w: Walk) -> int:
    """``-1`` at the entry the batch merges into; the other entries their sizes at b."""
    if len(node.input) > 1 and node.input[1] in data:
        raise w.fail(node, "its target is computed from the data")
    s, out = w.shapes[node.input[0]], w.shapes[node.output[0]]
    found = merged_axis(s, w.axis[node.input[0]], w.inner.get(node.input[0], 1), out, w.b)
    if found is None:
        raise w.fail(node, f"the batch axis of {s} has no place in {out}")
    q, w.inner[node.output[0]] = found
    if node.op_type == "Reshape":
        target = np.asarray([-1 if k == q else d for k, d in enumerate(out)], np.int64)
        _set_input(node, 1, target, w)
    return q


def merged_axis(s: list[int], p: int, inner: int, out: list[int], b: int):
    """(axis, inner) of the batch in ``out``, reshaped from ``s`` where it is axis ``p``
    (of size ``outer * b * inner``): an axis of ``out`` whose dims after it, times an
    ``inner`` factor of its own, span the batch's stride. Several fit when dims are 1: a
    standalone axis of size ``b`` first; else, when the reshape adds dims, the last
    (``[N, B, E] -> [N, B*H, d]``: heads split), when it removes them the first
    (``[N, B, E] -> [N*B, E]``: a linear layer's flattening)."""
    stride, total = inner * prod(s[p + 1 :]), prod(s)
    before, found = total // (stride * b), []
    for k in range(len(out)):
        after = prod(out[k + 1 :])
        if stride % after or out[k] % (stride // after * b):
            continue
        if prod(out[:k]) * (out[k] // (stride // after * b)) == before:
            found.append((k, stride // after))
    alone = [f for f in found if out[f[0]] == b and f[1] == 1]
    grows = len(out) > len(s) - (s[p] == b and inner == 1)
    pick = alone or (found[-1:] if grows else found[:1])
    return pick[0] if pick else None


def _set_input(node, k: int, value: np.ndarray, w: Walk) -> None:
    name = f"{node.name}/batch_{k}"
    w.inits[name] = value
    node.input[k] = name
    w.notes.append(f"{node.op_type} {node.name}: input {k} = {value.tolist()}")


def _transpose(node, data, w: Walk) -> int:
    return list(attr(node, "perm")).index(w.axis[data[0]])


def _axes(node, w: Walk, rank: int) -> list[int]:
    """The op's axes (attribute or constant input 1), made non-negative."""
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1] in w.consts:
        axes = w.consts[node.input[1]].reshape(-1).tolist()
    return sorted(a % rank for a in (axes if axes is not None else range(rank)))


def _squeeze(node, data, w: Walk) -> int:
    p, shape = w.axis[data[0]], w.shapes[data[0]]
    given = attr(node, "axes") is not None or len(node.input) > 1
    axes = _axes(node, w, len(shape)) if given else [k for k, d in enumerate(shape) if d == 1]
    if p in axes:
        raise w.fail(node, "it removes the batch axis")
    return p - sum(a < p for a in axes)


def _unsqueeze(node, data, w: Walk) -> int:
    rank = _rank(w, node.output[0])
    kept = [k for k in range(rank) if k not in _axes(node, w, rank)]
    return kept[w.axis[data[0]]]


def _reduce(node, data, w: Walk) -> int:
    p, rank = w.axis[data[0]], _rank(w, data[0])
    axes = [attr(node, "axis", 0) % rank] if node.op_type.startswith("Arg") else None
    axes = axes or _axes(node, w, rank)
    if p in axes:
        raise w.fail(node, "it reduces along the batch axis")
    return p if attr(node, "keepdims", 1) else p - sum(a < p for a in axes)


def _gather(node, data, w: Walk) -> int:
    """Gather along another axis; a Gather of every element of a flat tensor, in order (an
    ``as_strided`` that changes no element: ``[768] -> [1, 768, 1, 1]``) becomes a Reshape."""
    idx = w.consts.get(node.input[1])
    if idx is not None and _rank(w, node.input[0]) == 1 and _in_order(idx, w, node):
        node.op_type = "Reshape"
        del node.attribute[:]
        return _reshape(node, data, w)
    p, axis = w.axis[node.input[0]], attr(node, "axis", 0) % _rank(w, node.input[0])
    if node.input[0] not in data or node.input[1] in data or p == axis:
        raise w.fail(node, "it gathers along the batch axis")
    return p if p < axis else p - 1 + w.consts[node.input[1]].ndim


def _in_order(idx: np.ndarray, w: Walk, node) -> bool:
    n = w.shapes[node.input[0]][0]
    return idx.size == n and np.array_equal(idx.reshape(-1), np.arange(n))


def _along(node, data, w: Walk) -> int:
    """Slice, Split, Pad: nothing may change along the batch axis."""
    p, rank = w.axis[data[0]], _rank(w, data[0])
    if w.shapes[node.output[0]][p] != w.shapes[data[0]][p]:
        raise w.fail(node, "it changes the batch axis")
    if node.op_type == "Split" and attr(node, "axis", 0) % rank == p:
        raise w.fail(node, "it splits the batch axis")
    if node.op_type == "Slice" and len(node.input) > 3 and p in _axes_input(node, w, rank):
        raise w.fail(node, "it slices the batch axis")
    return p


def _axes_input(node, w: Walk, rank: int) -> list[int]:
    return [a % rank for a in w.consts[node.input[3]].reshape(-1).tolist()]


def _expand(node, data, w: Walk) -> int:
    """The target keeps the input's batch: entry ``1`` there."""
    if node.input[1] in data:
        raise w.fail(node, "its target is computed from the data")
    target = w.consts[node.input[1]].astype(np.int64).copy()
    q = w.axis[node.input[0]] + len(target) - _rank(w, node.input[0])
    target[q] = 1
    _set_input(node, 1, target, w)
    return q


def _resize(node, data, w: Walk) -> int:
    q = _first_axis(node, data[:1], w)
    if len(node.input) > 3 and node.input[3]:
        sizes = w.consts[node.input[3]]
        sh.resize_spatial(node, sizes, w.shapes[node.input[0]], w.opset, w.inits)
        w.notes.append(f"Resize {node.name}: sizes {sizes.tolist()} on the spatial axes")
    return q


def _matmul(node, data, w: Walk) -> int:
    """The batch must not be a contracted axis; a row (A) or column (B) axis stays one."""
    rank, qs = _rank(w, node.output[0]), set()
    for k, i in enumerate(node.input[:2]):
        if i not in data:
            continue
        p, r = w.axis[i], _rank(w, i)
        if p == r - 1 - k or (r == 1):
            raise w.fail(node, "the batch is the contracted axis")
        qs.add(rank - 2 + k if p == r - 2 + k else p + rank - r)
    if len(qs) != 1:
        raise w.fail(node, f"its inputs carry the batch on different axes {sorted(qs)}")
    return qs.pop()


def _gemm(node, data, w: Walk) -> int:
    if data != [node.input[0]] or w.axis[data[0]] != attr(node, "transA", 0):
        raise w.fail(node, "the batch is not the rows of its input A")
    return 0


def concat(node, data, w: Walk) -> tuple[int, list]:
    """Batch data concatenated with constants: each constant expanded to the batch at run
    time (``Concat(Shape(x)[0:1], its other dims)``), when the batch is axis 0 alone."""
    q = _aligned_concat(node, data, w)
    extra = []
    for k, c in enumerate(node.input):
        if c in data:
            continue
        value = w.consts.get(c)
        alone = w.shapes[data[0]][0] == w.b and w.inner.get(data[0], 1) == 1
        if q != 0 or value is None or not alone or not _one(value, w.b):
            raise w.fail(node, f"input {c!r} does not carry the batch")
        name = f"{node.name}/batch_{k}"
        w.inits[name] = value[:1]
        nodes, target = sh.batch_expand(w.x, name, np.asarray(value.shape[1:]), w.inits)
        extra += nodes
        node.input[k] = target
        w.notes.append(f"Concat {node.name}: input {c!r} {list(value.shape)} expanded to "
                       "the batch, Shape(x)[0:1]")  # fmt: skip
    return q, extra


def _aligned_concat(node, data, w: Walk) -> int:
    qs = {w.axis[i] for i in data}
    rank = _rank(w, node.output[0])
    if len(qs) != 1 or attr(node, "axis") % rank in qs:
        raise w.fail(node, "it concatenates along the batch axis")
    return qs.pop()


def _one(value: np.ndarray, b: int) -> bool:
    """A constant equal for every frame of the fixed batch (axis 0 of size 1 or b)."""
    return value.ndim > 0 and value.shape[0] in (1, b) and bool((value == value[:1]).all())


RULES = {
    **dict.fromkeys(FIRST_AXIS, _first_axis),
    **dict.fromkeys(REDUCE, _reduce),
    **dict.fromkeys(("Slice", "Split", "Pad"), _along),
    "Reshape": _reshape, "Transpose": _transpose, "Flatten": _reshape, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Gather": _gather, "Expand": _expand, "Resize": _resize,
    "MatMul": _matmul, "Gemm": _gemm,
}  # fmt: skip
"""Op -> the batch axis of its output; any other op: :func:`aligned`."""
