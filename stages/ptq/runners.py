"""The PTQ chain's models behind the StageModel interface (stages/stage_models.py).

calibrated and ptq are QDQ graphs: a layer's value is the output of the last node carrying
its layer id (its output DequantizeLinear, a float on the layer's grid); weight QDQ nodes
are not layers. quantized is the integer graph (layers.json as convert writes it); hbm and
board run the .hbm on the simulator. Every model reads the evaluation samples ``idx``.
"""

from __future__ import annotations

import numpy as np
import onnx

from simulator import hbm
from simulator.executor import Executor
from stages.onnx_export import LAYER_KEY
from stages.onnx_runner import OnnxRunner
from stages.stage_models import StageModel, dequantize
from stages.stage_runners import _run_fed


def layer_tensors(model: onnx.ModelProto) -> dict[str, str]:
    """Layer id -> the tensor holding its value (the last node of that id, weights aside)."""
    out: dict[str, str] = {}
    for node in model.graph.node:
        lid = {p.key: p.value for p in node.metadata_props}.get(LAYER_KEY)
        if lid and node.output and "[weight]" not in node.name:
            out[lid] = node.output[0]
    return out


def qdq_model(stage: str, path, x: np.ndarray, integer: dict) -> StageModel:
    """A QDQ ONNX stage (calibrated, ptq)."""
    runner = OnnxRunner(path)
    tensors = layer_tensors(runner.model)

    def run(idx, replace):
        feeds = {tensors[k]: np.asarray(v, np.float32) for k, v in (replace or {}).items()}
        return _run_fed(runner, x[idx], tensors, feeds)

    return StageModel(stage, run, {k: max(v["scale"]) for k, v in integer.items()})


def integer_model(stage: str, path, x: np.ndarray, integer: dict) -> StageModel:
    """The integer graph (quantized), dequantized per layer."""
    from stages.stage_models import quantize_like

    runner = OnnxRunner(path)
    tensors = {lid: v["tensor"] for lid, v in integer.items()}

    def run(idx, replace):
        feeds = {integer[k]["tensor"]: quantize_like(v, integer[k])
                 for k, v in (replace or {}).items() if k in integer}  # fmt: skip
        out, values = _run_fed(runner, x[idx], tensors, feeds)
        return out, {lid: dequantize(v, integer[lid]) for lid, v in values.items()}

    return StageModel(stage, run, {k: max(v["scale"]) for k, v in integer.items()})


def hbm_model(stage: str, path, x: np.ndarray, integer: dict) -> StageModel:
    """The .hbm on the simulator (outputs and captured layers, dequantized)."""
    executor = Executor(hbm.load(path))
    name = next(iter(executor.program.inputs))

    def run(idx, replace):
        outs, values = executor.run({name: x[idx]}, capture=True)
        out = np.asarray(next(iter(outs.values())), dtype=np.float32)
        return out, {k: dequantize(v, integer[k]) for k, v in values.items() if k in integer}

    return StageModel(stage, run, {k: max(v["scale"]) for k, v in integer.items()}, False)
