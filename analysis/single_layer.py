"""The error a layer of quantized.onnx adds on its own, separated from what it inherits.

Each integer node is re-evaluated on the *reference* model's inputs (qat.export's captured
tensors, expressed as integers at the node's input scales) and compared with the reference
output of its layer, in output quantization steps. This is the "single" column of peer
tools (every layer fed golden inputs), against the "entire" chain where errors propagate.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from simulator.arith.custom_ops import CUSTOM_OPS, DOMAIN
from stages.stage_models import quantize_like


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def own_error_steps(
    model: onnx.ModelProto, layers: dict, ref: dict[str, np.ndarray]
) -> dict[str, tuple[float, float]]:
    """Layer id -> (max |node(reference inputs) - reference output| in output steps,
    share of output elements that differ at all)."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    by_tensor = {v["tensor"]: (lid, v) for lid, v in layers.items()}
    steps = {}
    for node in model.graph.node:
        out = by_tensor.get(node.output[0])
        if node.domain != DOMAIN or node.op_type not in CUSTOM_OPS or out is None:
            continue
        inputs = _inputs(node, inits, by_tensor, ref)
        if inputs is None or out[0] not in ref:
            continue
        got = np.asarray(CUSTOM_OPS[node.op_type].evaluate(inputs, _attrs(node)))
        want = quantize_like(ref[out[0]], out[1]).astype(np.int64)
        diff = np.abs(got.astype(np.int64) - want)
        steps[out[0]] = (float(diff.max()), float((diff > 0).mean()))
    return steps


def _inputs(node, inits, by_tensor, ref) -> list[np.ndarray] | None:
    inputs = []
    for name in node.input:
        if name in inits:
            inputs.append(inits[name])
        elif name in by_tensor and by_tensor[name][0] in ref:
            lid, info = by_tensor[name]
            inputs.append(quantize_like(ref[lid], info))
        else:
            return None  # an intermediate without a reference: not a layer boundary
    return inputs
