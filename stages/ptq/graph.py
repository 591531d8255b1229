"""Small ONNX graph helpers shared by the PTQ stages: layer ids, users, op groups, saving."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import onnx
from onnx import helper

from schemas.fileio import atomic_save
from stages.onnx_builder import LAYER_KEY

OPSET = 21
"""The ONNX opset of every PTQ-stage model (int16 Q/DQ needs 21; docs/environment.md "ONNX")."""

COMPUTE_OPS = frozenset(
    {"Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "ReduceMean",
     "GlobalAveragePool", "AveragePool", "Concat"}
)  # fmt: skip
"""Ops whose output gets its own quantizer (convert requantizes into it)."""
PASSTHROUGH_OPS = frozenset(
    {"Relu", "Clip", "MaxPool", "Reshape", "Flatten", "Transpose", "Slice", "Unsqueeze",
     "Squeeze", "Gather", "Split", "Pad", "Identity", "Expand"}
)  # fmt: skip
"""Ops that run on the integers and keep the input's scale (no quantizer of their own)."""
TABLE_OPS = frozenset(
    {"Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Softplus", "HardSigmoid",
     "HardSwish", "Gelu", "LeakyRelu", "Elu", "Softmax"}
)  # fmt: skip
"""Ops that become one lookup table (Softmax: the composite of two) at the ptq stage."""
ISLAND_OPS = frozenset(
    {"Resize", "ConvTranspose", "PRelu", "LayerNormalization", "GlobalMaxPool", "ReduceMax",
     "ReduceSum", "DepthToSpace", "SpaceToDepth", "Abs", "Neg", "Pow", "Min", "Max", "Where",
     "ReduceMin", "InstanceNormalization", "Einsum", "LogSoftmax", "Floor", "Ceil", "Round",
     "Sign"}
)  # fmt: skip
"""Ops without an integer form: float between an input dequantize and an output quantizer
(a float island convert lists and the board runs on its CPU side)."""
MASK_OPS = frozenset({"Greater", "Less", "Equal", "Not", "And", "Or"})
"""Comparisons and logic building a mask (bool): float islands without a quantizer."""
REMOVED_OPS = frozenset({"BatchNormalization", "Dropout", "Constant", "Cast"})
"""Ops the optimized stage folds, fuses or removes (Cast only float -> float)."""
SUPPORTED_OPS = COMPUTE_OPS | PASSTHROUGH_OPS | TABLE_OPS | ISLAND_OPS | MASK_OPS | REMOVED_OPS
"""Every standard-domain op the PTQ chain takes; anything else is refused by name."""
WEIGHT_AXIS = {"Conv": 0, "Gemm": 0, "MatMul": 1}
"""Output-channel axis of the constant weight input (input 1) of a weighted op."""


def layer_of(node: onnx.NodeProto) -> str:
    """The canonical layer id of ``node`` (its metadata, else its name)."""
    for p in node.metadata_props:
        if p.key == LAYER_KEY:
            return p.value
    return node.name


def set_layer(node: onnx.NodeProto, layer: str) -> None:
    """Tag ``node`` with layer id ``layer`` (replacing an earlier tag)."""
    keep = [(p.key, p.value) for p in node.metadata_props if p.key != LAYER_KEY]
    del node.metadata_props[:]
    for k, v in keep:
        node.metadata_props.add(key=k, value=v)
    node.metadata_props.add(key=LAYER_KEY, value=layer)


def users(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes reading it, in graph order."""
    out: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            if name:
                out[name].append(node)
    return out


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Tensor name -> the node writing it."""
    return {o: n for n in graph.node for o in n.output if o}


def size_nodes(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes of a run-time size computation: ``Shape`` and the nodes whose
    non-constant inputs all come from one (the Concat building a class token's Expand
    target, the Expand of the constant token); compile runs them on the CPU side, as
    :meth:`stages.compile_graph.Compiler` decides, and no quantizer goes on them."""
    inits = {i.name for i in model.graph.initializer}
    values: set[str] = set()
    out = set()
    for node in model.graph.node:
        data = [i for i in node.input if i and i not in inits]
        if node.op_type == "Shape" or (data and all(i in values for i in data)):
            values.update(node.output)
            out.add(node.name)
    return out


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of attribute ``name`` (strings decoded), or ``default``."""
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def rename_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every node (and graph output) reading ``old`` reads ``new`` instead."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for out in graph.output:
        if out.name == old:
            out.name = new


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` to a temporary name and rename it into place (never half-written)."""
    atomic_save(path, lambda tmp: onnx.save(model, tmp))
