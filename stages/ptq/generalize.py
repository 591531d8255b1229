"""A fixed batch made dynamic: the user's file fixes the batch at ``b`` (its exporter
traced ``[1, 3, H, W]``), the chain evaluates batches of any size.

Every shape is known at batch ``b`` (``original`` folded the size computations). The walk
follows the batch axis from every fed input (axis 0) through every node, in graph order, and
rewrites what fixes it:
- a Reshape target gets ``-1`` at the entry the batch merges into (found by the product of
  the dims before it: ``[N, B, E] -> [N, B*H, d]`` is entry 1), the rest its sizes at ``b``;
- an Expand target keeps the input's batch (entry ``1``);
- a Resize's ``sizes`` become constant spatial sizes (:func:`stages.ptq.shapes.resize_spatial`);
- a constant concatenated with batch data (a class token expanded to ``[b, 1, D]`` and
  folded) is expanded to the batch at run time, ``Concat(Shape(x)[0:1], ...)``;
- ops that reduce, gather, split, slice or normalize along the batch axis, or a constant
  that differs along it, cannot be generalized: a StageError names the node.
The per-op rules are :mod:`stages.ptq.batch_rules`. ``original`` then proves the result
(:func:`stages.ptq.batch.prove_same`: the file on chunks of ``b`` frames against the
generalized model on all of them).
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from schemas.errors import StageError
from stages.ptq import feeds
from stages.ptq import shapes as sh
from stages.ptq.batch_rules import BATCH, RULES, Walk, aligned, concat


def generalize(model: onnx.ModelProto, b: int) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` (batch fixed at ``b``, size computations folded) with a dynamic
    batch; one line per rewrite, for model_check_result.txt."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inferred = onnx.shape_inference.infer_shapes(out, data_prop=True)
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    fed = feeds.graph_inputs(out)
    axis = dict.fromkeys(fed, 0)  # the batch axis, followed from every input
    x = fed[0]  # the batch of expanded constants is read from the first input
    w = Walk(sh.static_shapes(inferred), consts, b, x, sh.opset_of(model), axis)
    nodes = []
    for node in g.node:
        data = [i for i in node.input if i in w.axis]
        if data:
            nodes += _visit(node, data, w)
        else:
            nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in w.inits.items())
    _dynamic_io(g, w, fed)
    return out, w.notes


def _dynamic_io(g: onnx.GraphProto, w: Walk, fed: list[str]) -> None:
    """Every fed input's dim 0 and each output's batch axis named ``batch``; shapes
    inferred again."""
    inputs = [(i, 0) for i in g.input if i.name in fed]
    for v, k in [*inputs, *((o, w.axis.get(o.name)) for o in g.output)]:
        if k is None:
            raise StageError(f"original: output {v.name!r} does not follow the batch",
                             where=f"{sh.FIELD} / output {v.name}",
                             hint="export the model with a dynamic batch (dim 0)")  # fmt: skip
        dim = v.type.tensor_type.shape.dim[k]
        dim.Clear()
        dim.dim_param = BATCH
    del g.value_info[:]


def _visit(node: onnx.NodeProto, data: list[str], w: Walk) -> list[onnx.NodeProto]:
    """The batch axis of ``node``'s outputs (its rewrites done); the nodes to emit."""
    extra: list[onnx.NodeProto] = []
    if node.op_type == "Concat":
        q, extra = concat(node, data, w)
    else:
        q = RULES.get(node.op_type, aligned)(node, data, w)
    inner = w.inner.get(node.output[0], w.inner.get(data[0], 1))
    for o in node.output:
        w.axis[o], w.inner[o] = q, inner
    return [*extra, node]
