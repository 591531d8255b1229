"""The loaders behind :func:`stages.stage_models.open_stage_model`, one per kind of model.

- torch (calibrate, qat, pre_export): the QAT graph, captured by :mod:`stages.capture`;
- ONNX (export): qat.onnx by :class:`stages.onnx_runner.OnnxRunner`, layers named by id;
- integer ONNX (convert): quantized.onnx, layer integers dequantized with layers.json;
- .hbm (compile, board_sim): the simulator's executor, dequantized with convert's layers.
"""

from __future__ import annotations

import numpy as np
import torch

from schemas.artifacts import Artifact, HbmModel
from simulator import hbm
from simulator.executor import Executor
from stages.board_sim import camera_feed
from stages.capture import capture
from stages.context import RunContext
from stages.fake_quant import quantizers
from stages.modelio import load_qat, name_quantizers
from stages.onnx_runner import COMPUTED, OnnxRunner
from stages.stage_models import (
    Captured,
    StageModel,
    as_torch_input,
    dequantize,
    integer_layers,
    quantize_like,
)


def torch_model(ctx: RunContext, art: Artifact) -> StageModel:
    """calibrate / qat / pre_export: the QAT graph (pre_export: with its fixed-point tables)."""
    if art.stage == "pre_export":
        from stages.pre_export import load_qat_export

        gm = load_qat_export(art, ctx)
    else:
        gm = load_qat(art, ctx)
    roles = name_quantizers(gm)
    scales = {
        roles[name][0]: float(fq.scale.max())
        for name, fq in quantizers(gm)
        if name in roles and roles[name][1] in ("output", "input")
    }

    def run(idx, replace):
        x = as_torch_input(ctx.evaluation.x[idx])
        subs = {k: torch.from_numpy(np.asarray(v)) for k, v in (replace or {}).items()}
        out, values = capture(gm, x, subs)
        return _first(out), {k: v.detach().numpy() for k, v in values.items()}

    return StageModel(art.stage, run, scales)


def onnx_model(ctx: RunContext, art: Artifact) -> StageModel:
    """export: qat.onnx, every layer's float tensor named by its layer id."""
    runner = OnnxRunner(ctx.run.path(art.onnx_file))
    ids = [i for i in art.layer_ids if i in runner.tensor_names]
    scales = {lid: max(v["scale"]) for lid, v in _maybe_integer_layers(ctx).items()}

    def run(idx, replace):
        feeds = {k: np.asarray(v, dtype=np.float32) for k, v in (replace or {}).items()}
        return _run_fed(runner, ctx.evaluation.x[idx], {i: i for i in ids}, feeds)

    return StageModel(art.stage, run, scales)


def integer_model(ctx: RunContext, art: Artifact) -> StageModel:
    """convert: quantized.onnx; each layer's integers dequantized at its scale."""
    runner = OnnxRunner(ctx.run.path(art.onnx_file))
    layers = integer_layers(ctx)

    def run(idx, replace):
        feeds = {
            layers[k]["tensor"]: quantize_like(v, layers[k])
            for k, v in (replace or {}).items()
            if k in layers
        }
        tensors = {lid: v["tensor"] for lid, v in layers.items()}
        out, values = _run_fed(runner, ctx.evaluation.x[idx], tensors, feeds)
        return out, {lid: dequantize(v, layers[lid]) for lid, v in values.items()}

    return StageModel(art.stage, run, {k: max(v["scale"]) for k, v in layers.items()})


def _run_fed(runner: OnnxRunner, x, tensors: dict[str, str], feeds: dict) -> Captured:
    """(output, {layer id: value}) with ``feeds`` substituted; a fed layer reports what its
    node computed from the fed inputs (``<tensor>#computed``)."""
    r = runner.with_inputs(tuple(feeds)) if feeds else runner
    names = {lid: t + COMPUTED if t in feeds else t for lid, t in tensors.items()}
    outs, values = r.run_capture(x, list(dict.fromkeys(names.values())), feeds)
    return np.asarray(outs[0]), {lid: np.asarray(values[n]) for lid, n in names.items()}


def hbm_model(ctx: RunContext, art: Artifact) -> StageModel:
    """compile: model.hbm on the simulator; board_sim: board.hbm fed camera frames."""
    layers = integer_layers(ctx)
    if art.stage == "board_sim":
        compiled = ctx.run.load_artifact("compile", HbmModel)
        board = art.runtime_format != "featuremap"
        path = compiled.board_file if board else compiled.hbm_file
    else:
        board, path = False, art.hbm_file
    executor = Executor(hbm.load(ctx.run.path(path)))

    def run(idx, replace):
        if board:
            feed = camera_feed(ctx, ctx.splits["camera"].x[idx])
        else:
            feed = {next(iter(executor.program.inputs)): ctx.evaluation.x[idx]}
        outs, values = executor.run(feed, capture=True)
        out = np.asarray(next(iter(outs.values())), dtype=np.float32)
        return out, {lid: dequantize(v, layers[lid]) for lid, v in values.items() if lid in layers}

    return StageModel(art.stage, run, {k: max(v["scale"]) for k, v in layers.items()}, False)


def _maybe_integer_layers(ctx: RunContext) -> dict[str, dict]:
    """convert's layers when convert has run in this run, else none."""
    if not ctx.run.path("artifacts/convert/layers.json").exists():
        return {}
    return integer_layers(ctx)


def _first(out) -> np.ndarray:
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out.detach().numpy()


LOADERS = {
    "calibrate": torch_model,
    "qat": torch_model,
    "pre_export": torch_model,
    "export": onnx_model,
    "convert": integer_model,
    "compile": hbm_model,
    "board_sim": hbm_model,
}
"""Stage name -> loader of its model (prepare's observers are uncalibrated: not compared)."""
