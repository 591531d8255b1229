"""Fold ONNX nodes that compute only on constants into initializers (before convert).

A trainable table indexed by a constant (swin's relative position bias:
``Gather(table, index) -> Reshape -> Transpose -> Unsqueeze``), a PReLU slope reshaped
for broadcasting, a sliced position embedding: such chains read initializers only, so
their value is known before any input arrives. convert folds them (onnx's reference
evaluator runs each node once) and then quantizes the result like any other constant, so
no layout op on constants reaches the integer graph or the compiled program.
Quantize/Dequantize nodes are never folded: they are how convert finds integer weights.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

KEEP = frozenset({"QuantizeLinear", "DequantizeLinear"})


def fold_constant_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` with constant-only nodes replaced by initializers, and the names
    of the nodes folded (in graph order)."""
    graph = model.graph
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    kept, folded = [], []
    for node in graph.node:
        inputs = [n for n in node.input if n]
        if (
            node.domain
            or node.op_type in KEEP
            or not inputs
            or any(n not in values for n in inputs)
        ):
            kept.append(node)
            continue
        outs = run_node(node, {n: values[n] for n in inputs}, model.opset_import)
        values.update(zip(node.output, outs, strict=True))
        folded.append(node.name)
    if not folded:
        return model, []
    used = {n for node in kept for n in node.input} | {o.name for o in graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    del out.graph.initializer[:]
    out.graph.initializer.extend(
        numpy_helper.from_array(v, name) for name, v in values.items() if name in used
    )
    return out, folded


def run_node(node: onnx.NodeProto, feeds: dict, opsets) -> list:
    """One node on constant inputs, by onnx's reference evaluator."""
    graph = helper.make_graph(
        [node],
        "fold",
        [],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output],
        [numpy_helper.from_array(v, k) for k, v in feeds.items()],
    )
    model = helper.make_model(graph, opset_imports=list(opsets))
    return ReferenceEvaluator(model).run(None, {})
