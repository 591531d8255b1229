"""Fixed input shapes and folded shape computations for an exported ONNX model.

Exporters write sizes as graphs: ``Shape -> Gather -> Range -> Cast`` for a detector's
anchor grid, ``Shape -> Slice -> Concat -> Reshape`` for a head's flattening,
``ConstantOfShape`` for masks. With every input dim known they are constants.

- :func:`fix_input_shapes` writes ``model.input_shapes`` (the vendor's ``input_shape``)
  into the graph inputs; a non-batch dim left dynamic is an error naming the input, the dim
  and the field. Dim 0 is the batch: the chain evaluates batches, so it stays dynamic.
- :func:`fold_shapes` evaluates the size computations with the batch set to 1 and to 2: a
  value equal at both is a constant and becomes an initializer; a value that follows the
  batch only in a Reshape target's first entry (``[B, 4, -1]``) becomes ``0`` ("copy the
  input's dim"). What was folded is listed for model_check_result.txt.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from schemas.errors import StageError
from stages.onnx_fold import run_node

FIELD = "model.input_shapes"
NEVER = frozenset({"QuantizeLinear", "DequantizeLinear", "RandomNormal", "RandomUniform",
                   "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"})  # fmt: skip
"""Ops never folded: Q/DQ carry the integer weights, random ops are not constants."""


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]], path) -> None:
    """Write ``shapes`` (input name -> dims) into ``model``'s inputs, in place; dim 0 stays
    the dynamic batch. Unknown names, wrong ranks and dims still dynamic are errors."""
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    for name, dims in shapes.items():
        if name not in inputs:
            raise StageError(
                f"{FIELD} names input {name!r}, the model's inputs are {sorted(inputs)}",
                where=f"{FIELD}.{name}",
                hint="use the graph input names of the ONNX file",
            )
        _write_dims(inputs[name], list(dims), path)
    dynamic = {
        i.name: [(k, d.dim_param or "?") for k, d in enumerate(_dims(i)) if k and not d.dim_value]
        for i in inputs.values()
    }
    dynamic = {k: v for k, v in dynamic.items() if v}
    if dynamic:
        what = "; ".join(f"{n}: " + ", ".join(f"dim {k} ({p})" for k, p in v)
                         for n, v in dynamic.items())  # fmt: skip
        example = {n: [1, *("N" for _ in _dims(inputs[n])[1:])] for n in dynamic}
        raise StageError(
            f"{path}: dynamic input dims other than the batch: {what}",
            where=FIELD,
            hint=f"fix them in the spec, e.g. {FIELD}: {example} with the sizes the model "
            "is deployed at (the vendor's input_shape)",
        )


def _dims(value: onnx.ValueInfoProto):
    return value.type.tensor_type.shape.dim


def _write_dims(value: onnx.ValueInfoProto, dims: list[int], path) -> None:
    old = _dims(value)
    if len(old) != len(dims) or any(not isinstance(d, int) or d <= 0 for d in dims):
        raise StageError(
            f"{FIELD}.{value.name} = {dims} does not fit the input's rank {len(old)}",
            where=f"{FIELD}.{value.name}",
            hint=f"give {len(old)} positive sizes, the first the batch (e.g. 1)",
        )
    for k, d in enumerate(dims):
        if k and not old[k].dim_value:
            old[k].Clear()
            old[k].dim_value = d
        elif k and old[k].dim_value != d:
            raise StageError(
                f"{FIELD}.{value.name} dim {k} = {d}, the model has {old[k].dim_value}",
                where=f"{FIELD}.{value.name}",
                hint=f"{path} fixes that dim; give its size or leave the input out",
            )


def fold_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """A copy of ``model`` with its size computations folded; the nodes folded."""
    at = [_constants(_with_batch(model, b)) for b in (1, 2)]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph, kept, folded, inits = out.graph, [], [], {}
    for node in graph.node:
        values = [_same(at[0].get(o), at[1].get(o)) for o in node.output]
        if node.output and all(v is not None for v in values):
            inits.update(zip(node.output, values, strict=True))
            folded.append(node)
            continue
        target = _batch_target(node, at)
        if target is not None:
            inits[node.input[1] + "/folded"] = target
            node.input[1] = node.input[1] + "/folded"
        kept.append(node)
    if not folded and not inits:
        return model, []
    unread = _replace(graph, kept, inits)
    return out, folded + unread


def _with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for i in m.graph.input:
        if _dims(i):
            _dims(i)[0].Clear()
            _dims(i)[0].dim_value = batch
    return onnx.shape_inference.infer_shapes(m, data_prop=True)


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    g = model.graph
    shapes = {}
    for v in [*g.input, *g.value_info, *g.output]:
        dims = _dims(v)
        if v.type.tensor_type.HasField("shape") and all(d.dim_value > 0 for d in dims):
            shapes[v.name] = [d.dim_value for d in dims]
    return shapes


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every value computable without the inputs' values: initializers, Constant nodes,
    ``Shape`` of a statically shaped tensor, and nodes reading only such values."""
    shapes = _static_shapes(model)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.domain or node.op_type in NEVER:
            continue
        if node.op_type == "Shape" and node.input[0] in shapes:
            values[node.output[0]] = _shape_value(node, shapes[node.input[0]])
        elif all(i in values for i in node.input if i) and (
            node.input or node.op_type == "Constant"
        ):
            feeds = {i: values[i] for i in node.input if i}
            values.update(zip(node.output, run_node(node, feeds, model.opset_import), strict=True))
    return values


def _shape_value(node: onnx.NodeProto, shape: list[int]) -> np.ndarray:
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.asarray(shape[start:end] if end else shape[start:], np.int64)


def _same(a, b) -> np.ndarray | None:
    if a is None or b is None:
        return None
    a, b = np.asarray(a), np.asarray(b)
    return a if a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b) else None


def _batch_target(node: onnx.NodeProto, at: list[dict]) -> np.ndarray | None:
    """A Reshape target that follows the batch in its first entry only: ``[0, ...]``."""
    if node.op_type != "Reshape" or len(node.input) < 2:
        return None
    a, b = (np.asarray(v[node.input[1]]) if node.input[1] in v else None for v in at)
    if a is None or b is None or a.shape != b.shape or a.ndim != 1 or not a.size:
        return None
    if (a[0], b[0]) == (1, 2) and np.array_equal(a[1:], b[1:]):
        return np.concatenate([[0], a[1:]]).astype(np.int64)
    return None


def _replace(graph: onnx.GraphProto, kept: list, inits: dict[str, np.ndarray]) -> list:
    """Set ``graph``'s nodes to ``kept`` minus the ones nothing reads any more (returned:
    a batch-dependent ``Shape`` whose every reader folded), with ``inits`` among its
    initializers (only those still read)."""
    outputs, before = {o.name for o in graph.output}, kept
    while True:
        used = {i for n in kept for i in n.input} | outputs
        alive = [n for n in kept if any(o in used for o in n.output)]
        if len(alive) == len(kept):
            break
        kept = alive
    used = {i for n in kept for i in n.input} | outputs
    old = [i for i in graph.initializer if i.name in used and i.name not in inits]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(old)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items() if k in used)
    return [n for n in before if n not in kept]


def render_folded(folded: list[onnx.NodeProto]) -> list[str]:
    """The model_check_result.txt section listing the folded size computations."""
    counts = Counter(n.op_type for n in folded)
    lines = [f"## shape computations folded into constants ({len(folded)} nodes)"]
    lines += [f"{op}: {k}" for op, k in sorted(counts.items())] or ["none"]
    if folded:
        lines.append("nodes: " + ", ".join(n.name or n.op_type for n in folded))
    return lines
