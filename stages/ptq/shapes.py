"""Fixed input shapes and folded shape computations for an exported ONNX model.

Exporters write sizes as graphs: ``Shape -> Gather -> Range -> Cast`` for a detector's
anchor grid, ``Shape -> Slice -> Concat -> Reshape`` for a head's flattening,
``ConstantOfShape`` for masks. With every input dim known they are constants.

- :func:`fix_input_shapes` writes ``model.input_shapes`` (the vendor's ``input_shape``)
  into the graph inputs; a non-batch dim left dynamic is an error naming the input, the dim
  and the field. Dim 0 is the batch: the chain evaluates batches, so it stays dynamic.
- :func:`fold_shapes` evaluates the size computations with the batch set to 1 and to 2: a
  value equal at both is a constant and becomes an initializer. A target that follows the
  batch (its first entry ``B`` or ``k*B``, the rest equal at both) is rewritten so that it
  needs no size computation: a Reshape's first entry becomes ``-1`` (or ``0``, "copy the
  input's dim", when another entry is -1 and the entry is ``B``); an Expand's target
  ``[B, ...]`` becomes ``Concat(Shape(x)[0:1], ...)`` of the graph input, the class-token
  form the QAT chain exports and compile runs on the CPU side; a Resize's ``sizes`` that
  keep the input's batch and channels become constant sizes on the spatial ``axes``
  (opset >= 18) or constant ``scales`` when those are exact. What was folded and rewritten
  is listed for model_check_result.txt; ``original`` then proves the outputs unchanged
  (:func:`stages.ptq.batch.prove_same`).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

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


class Folded(NamedTuple):
    """What :func:`fold_shapes` made: the model, the nodes folded away, and one line per
    node whose target now follows the batch (``Reshape r: [-1, 4, 16]``)."""

    model: onnx.ModelProto
    nodes: list[onnx.NodeProto]
    rewrites: list[str]


PASSES = 64
"""Folding passes at most: a folded Reshape target sizes its output, whose ``Shape`` folds
in the next pass (TorchScript's shufflenet channel split: 14 passes; vit_b_16: 2)."""


def fold_shapes(model: onnx.ModelProto, fixed: int | None = None) -> Folded:
    """A copy of ``model`` with its size computations folded (module docstring), pass after
    pass (shapes inferred afresh) until one folds nothing; with the batch ``fixed``,
    evaluated at that batch only, so what follows it folds too (the generalizing walk then
    rewrites the targets that carry it)."""
    done = Folded(model, [], [])
    for _ in range(PASSES):
        step = _fold_pass(done.model, fixed)
        if step.model is done.model:  # nothing folded or rewritten
            break
        del step.model.graph.value_info[:]  # stale: the next pass infers them again
        nodes = [copy.deepcopy(n) for n in step.nodes]  # not the pass's: they keep its model
        done = Folded(step.model, done.nodes + nodes, done.rewrites + step.rewrites)
    return done


def _fold_pass(model: onnx.ModelProto, fixed: int | None) -> Folded:
    if fixed:  # one batch: the two evaluations would be the same (and hold every weight)
        at = [_evaluate(_with_batch(model, fixed))] * 2
    else:
        at = [_evaluate(_with_batch(model, b)) for b in (1, 2)]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph, kept, folded, inits = out.graph, [], [], {}
    for node in graph.node:
        values = [_same(at[0][0].get(o), at[1][0].get(o)) for o in node.output]
        if node.output and all(v is not None for v in values):
            inits.update(zip(node.output, values, strict=True))
            folded.append(node)
            continue
        kept += _batch_rewrite(node, at, graph.input[0].name, inits, opset_of(model))
    if not folded and not inits:
        return Folded(model, [], [])
    unread = _replace(graph, kept, inits)
    return Folded(out, folded + unread, _rewrites(kept, inits))


def _rewrites(nodes: list, inits: dict) -> list[str]:
    """``<op> <node>: <input> = <value>`` for each node reading a rewritten target."""
    return [f"{n.op_type} {n.name}: {i} = {inits[i].tolist() if i in inits else 'Concat'}"
            + (f" on axes {list(attr.ints)}" if (attr := _attr(n, "axes")) else "")
            for n in nodes for i in n.input[1:] if i.endswith(REWRITTEN)]  # fmt: skip


REWRITTEN = ("/folded", "/target", "/sizes", "/scales")
"""Suffixes of the targets :func:`_batch_rewrite` writes."""


def _attr(node: onnx.NodeProto, name: str):
    return next((a for a in node.attribute if a.name == name), None)


def _with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for i in m.graph.input:
        if _dims(i):
            _dims(i)[0].Clear()
            _dims(i)[0].dim_value = batch
    return onnx.shape_inference.infer_shapes(m, data_prop=True)


def static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    g = model.graph
    shapes = {}
    for v in [*g.input, *g.value_info, *g.output]:
        dims = _dims(v)
        if v.type.tensor_type.HasField("shape") and all(d.dim_value > 0 for d in dims):
            shapes[v.name] = [d.dim_value for d in dims]
    return shapes


def _evaluate(model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    """Every value computable without the inputs' values (initializers, Constant nodes,
    ``Shape`` of a statically shaped tensor, and nodes reading only such values), and the
    static shapes."""
    shapes = static_shapes(model)
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
    return values, shapes


def _shape_value(node: onnx.NodeProto, shape: list[int]) -> np.ndarray:
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.asarray(shape[start:end] if end else shape[start:], np.int64)


def _same(a, b) -> np.ndarray | None:
    if a is None or b is None:
        return None
    a, b = np.asarray(a), np.asarray(b)
    return a if a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b) else None


def _batch_rewrite(node, at: list[dict], x: str, inits: dict, opset: int) -> list:
    """``node`` with a target that follows the batch rewritten (module docstring), and the
    nodes it now reads; ``[node]`` unchanged when none does."""
    k = {"Reshape": 1, "Expand": 1, "Resize": 3}.get(node.op_type)
    if k is None or len(node.input) <= k or not node.input[k]:
        return [node]
    if node.input[k].endswith(REWRITTEN):  # done in an earlier pass (it still follows the
        return [node]  # batch: rewriting it again would never end)
    a, b = (np.asarray(v[node.input[k]]) if node.input[k] in v else None for v, _ in at)
    if a is None or b is None or a.shape != b.shape or a.ndim != 1 or not a.size:
        return [node]
    if not np.array_equal(a[1:], b[1:]) or a[0] <= 0 or b[0] != 2 * a[0]:
        return [node]
    name = node.input[k] + "/folded"
    if node.op_type == "Reshape" and (-1 not in a[1:] or a[0] == 1):
        first = -1 if -1 not in a[1:] else 0  # -1: the rest are fixed; 0: copy the batch
        inits[name] = np.concatenate([[first], a[1:]]).astype(np.int64)
    elif node.op_type == "Expand" and a[0] == 1:
        nodes, node.input[k] = batch_expand(x, None, a[1:], inits, name)
        return [*nodes, node]
    elif node.op_type == "Resize" and _keeps_channels(node, (a, b), at):
        return [resize_spatial(node, a, at[0][1][node.input[0]], opset, inits)]
    else:
        return [node]
    node.input[k] = name
    return [node]


def batch_expand(x: str, src, rest, inits: dict, name: str | None = None):
    """The class-token form: nodes computing ``Concat(Shape(x)[0:1], rest)`` (``rest``
    stored as ``name``) and, with ``src``, an Expand of ``src`` to it; the nodes and the
    name of their result."""
    name = name or f"{src}/folded"
    inits[name] = np.asarray(rest, np.int64)
    size = helper.make_node("Shape", [x], [name + "/batch"], name=name + "/batch", end=1)
    concat = helper.make_node("Concat", [size.output[0], name], [name + "/target"],
                              name=name + "/target", axis=0)  # fmt: skip
    if src is None:
        return [size, concat], concat.output[0]
    out = f"{src}/expanded"
    expand = helper.make_node("Expand", [src, concat.output[0]], [out], name=out)
    return [size, concat, expand], out


def _keeps_channels(node, sizes: tuple, at: list) -> bool:
    """True if a Resize's ``sizes`` keep its input's batch and channels at both batches."""
    shapes = [s.get(node.input[0]) for _, s in at]
    return sizes[0].size > 2 and all(
        s is not None and list(s[:2]) == list(z[:2]) for s, z in zip(shapes, sizes, strict=True)
    )


def resize_spatial(node, sizes, in_shape, opset: int, inits: dict) -> onnx.NodeProto:
    """``node`` resized on its spatial axes only, by constants: ``sizes`` of those axes
    with ``axes`` (opset >= 18), else ``scales`` ``[1, 1, out/in...]`` when they give the
    same sizes and coordinates exactly (whole or exact float ratios)."""
    name = f"{node.name}/sizes"
    if opset >= 18:
        inits[name] = np.asarray(sizes[2:], np.int64)
        node.attribute.append(helper.make_attribute("axes", list(range(2, len(sizes)))))
        node.input[3] = name
        return node
    out, inp = np.asarray(sizes[2:], np.float32), np.asarray(in_shape[2:], np.float32)
    scales = np.concatenate([[1, 1], out / inp]).astype(np.float32)
    if not np.array_equal(np.floor(inp * scales[2:]), out):
        raise StageError(f"Resize {node.name}: sizes {list(sizes)} follow the batch and "
                         f"out/in = {scales[2:].tolist()} is not exact in float32",
                         where=f"{FIELD} / node {node.name}",
                         hint="export at opset >= 18 (Resize axes) or with constant "
                         "sizes, e.g. a fixed batch")  # fmt: skip
    inits[f"{node.name}/scales"] = scales
    node.input[2], node.input[3] = f"{node.name}/scales", ""
    del node.input[4:]
    return node


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


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


def render_folded(folded: Folded) -> list[str]:
    """The model_check_result.txt section listing the folded size computations and the
    targets that now follow the batch."""
    counts = Counter(n.op_type for n in folded.nodes)
    lines = [f"## shape computations folded into constants ({len(folded.nodes)} nodes)"]
    lines += [f"{op}: {k}" for op, k in sorted(counts.items())] or ["none"]
    if folded.nodes:
        lines.append("nodes: " + ", ".join(n.name or n.op_type for n in folded.nodes))
    lines += ["", f"## targets that follow the batch ({len(folded.rewrites)})"]
    return lines + (folded.rewrites or ["none"])
