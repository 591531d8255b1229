"""The PTQ chain's models behind the StageModel interface (stages/stage_models.py), built
by the same builders as the QAT chain's (stages/stage_runners.py).

calibrated and ptq are QDQ graphs: a layer's value is the output of the last node carrying
its layer id (its output DequantizeLinear, a float on the layer's grid); weight QDQ nodes
are not layers. quantized is the integer graph (layers.json as convert writes it); hbm and
board run the .hbm on the simulator. Every model reads the evaluation samples ``idx`` of
every input, fed by name (stages.ptq.feeds), and compares its judged output.
"""

from __future__ import annotations

import numpy as np
import onnx

from stages.onnx_export import LAYER_KEY
from stages.stage_models import StageModel
from stages.stage_runners import float_graph, integer_graph, program


def layer_tensors(model: onnx.ModelProto) -> dict[str, str]:
    """Layer id -> the tensor holding its value (the last node of that id, weights aside)."""
    out: dict[str, str] = {}
    for node in model.graph.node:
        lid = {p.key: p.value for p in node.metadata_props}.get(LAYER_KEY)
        if lid and node.output and "[weight]" not in node.name:
            out[lid] = node.output[0]
    return out


def qdq_model(stage: str, path, inputs: dict, integer: dict, at: int = 0) -> StageModel:
    """A QDQ ONNX stage (calibrated, ptq); ``inputs``: the evaluation samples of every graph
    input by name; its output ``at`` (the judged one) is compared."""
    tensors = layer_tensors(onnx.load(str(path)))
    return float_graph(stage, path, _feed(inputs), tensors, integer, at)


def integer_model(stage: str, path, inputs: dict, integer: dict, at: int = 0) -> StageModel:
    """The integer graph (quantized), dequantized per layer."""
    return integer_graph(stage, path, _feed(inputs), integer, at)


def hbm_model(stage: str, path, inputs: dict, integer: dict, at: int = 0) -> StageModel:
    """The .hbm on the simulator (outputs and captured layers, dequantized)."""
    return program(stage, path, _feed(inputs), integer, at=at)


def _feed(inputs: dict[str, np.ndarray]):
    """The samples ``idx`` of every input, by name (graphs and programs feed them so)."""
    return lambda idx: {k: v[idx] for k, v in inputs.items()}
