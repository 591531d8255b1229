"""The loaders behind :func:`stages.stage_models.open_stage_model`, one per kind of model.

- torch (prepare, calibrate, qat, pre_export): the QAT graph, captured by
  :mod:`stages.capture` (prepare's with every quantizer in FLOAT state: the float model);
- ONNX (export): qat.onnx by :class:`stages.onnx_runner.OnnxRunner`, layers named by id;
- integer ONNX (convert): quantized.onnx, layer integers dequantized with layers.json;
- .hbm (compile, board_sim): the simulator's executor, dequantized with convert's layers.

A model with several outputs is compared on its judged output (stages.outputs:
``compare.output``, else the first class-like one); every output has its stage metrics.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from schemas.artifacts import Artifact, HbmModel
from simulator.program import hbm
from simulator.runtime.executor import Executor
from stages.board_sim import camera_feed
from stages.capture import capture
from stages.context import RunContext
from stages.fake_quant import QuantState, quantizers, set_model_state
from stages.modelio import load_qat, name_quantizers
from stages.onnx_runner import COMPUTED, OnnxRunner
from stages.outputs import flat_outputs, judged_output
from stages.stage_models import (
    Captured,
    StageModel,
    as_torch_input,
    dequantize,
    integer_layers,
    quantize_like,
)


def torch_model(ctx: RunContext, art: Artifact) -> StageModel:
    """prepare / calibrate / qat / pre_export: the QAT graph (pre_export: with its
    fixed-point tables; prepare: every quantizer in FLOAT state, i.e. the float model with
    BN folded, whose uncalibrated quantizers give no scales)."""
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
    if art.stage == "prepare":
        set_model_state(gm, QuantState.FLOAT)
        scales = {}
    judged = judged_output(ctx.reference, ctx.spec.compare.output, _labelled(ctx))

    def run(idx, replace, keep=True):
        xs = tuple(as_torch_input(a[idx]) for a in ctx.evaluation.inputs.values())
        x = xs[0] if len(xs) == 1 else xs
        subs = {k: torch.from_numpy(np.asarray(v)) for k, v in (replace or {}).items()}
        out, values = capture(gm, x, subs, keep)
        return flat_outputs(out)[judged].detach().numpy(), {
            k: v.detach().numpy() for k, v in values.items()
        }

    return StageModel(art.stage, run, scales, outputs_only=lambda i, r: run(i, r, False)[0])


def onnx_model(ctx: RunContext, art: Artifact) -> StageModel:
    """export: qat.onnx, every layer's float tensor named by its layer id."""
    path = ctx.run.path(art.onnx_file)
    tensors = {i: i for i in art.layer_ids}
    layers = integer_layers(ctx, False)
    return float_graph(art.stage, path, _evaluation(ctx), tensors, layers, judged_index(ctx))


def integer_model(ctx: RunContext, art: Artifact) -> StageModel:
    """convert: quantized.onnx; each layer's integers dequantized at its scale."""
    path = ctx.run.path(art.onnx_file)
    return integer_graph(art.stage, path, _evaluation(ctx), integer_layers(ctx), judged_index(ctx))


def hbm_model(ctx: RunContext, art: Artifact) -> StageModel:
    """compile: model.hbm on the simulator; board_sim: board.hbm fed camera frames."""
    board = art.stage == "board_sim" and art.runtime_format != "featuremap"
    if art.stage == "board_sim":
        compiled = ctx.run.load_artifact("compile", HbmModel)
        path = compiled.board_file if board else compiled.hbm_file
    else:
        path = art.hbm_file
    at = judged_index(ctx)
    if board:
        return program(art.stage, ctx.run.path(path),
                       lambda idx: camera_feed(ctx, ctx.splits["camera"].x[idx]),
                       integer_layers(ctx), at=at)  # fmt: skip
    return program(art.stage, ctx.run.path(path), _evaluation(ctx), integer_layers(ctx), True, at)


def judged_index(ctx: RunContext) -> int:
    """The position of the judged output among a graph's outputs (pytree order)."""
    judged = judged_output(ctx.reference, ctx.spec.compare.output, _labelled(ctx))
    return list(ctx.reference).index(judged)


def _labelled(ctx: RunContext) -> bool:
    return ctx.evaluation.labels is not None


def _evaluation(ctx: RunContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    """The evaluation samples ``idx`` of every input, in order (read when the model runs)."""
    return lambda idx: tuple(a[idx] for a in ctx.evaluation.inputs.values())


def float_graph(
    stage: str, path, inputs, tensors: dict[str, str], layers: dict, at: int = 0
) -> StageModel:
    """A float/QDQ ONNX graph whose layer values are the ``tensors`` (layer id -> name);
    substituted values are fed as floats; its output ``at`` is compared."""
    runner = OnnxRunner(path)
    tensors = {lid: t for lid, t in tensors.items() if t in runner.tensor_names}

    def run(idx, replace, keep=tensors):
        feeds = {tensors[k]: np.asarray(v, np.float32) for k, v in (replace or {}).items()}
        return _run_fed(runner, inputs(idx), keep, feeds, at)

    output = _outputs_only(runner, run)
    return StageModel(stage, run, _scales(layers), forget=runner.forget_cuts, outputs_only=output)


def integer_graph(stage: str, path, inputs, layers: dict, at: int = 0) -> StageModel:
    """An integer ONNX graph (layers.json as convert writes it), dequantized per layer;
    substituted values are quantized at the layer's scale and fed as integers; its output
    ``at`` is compared."""
    runner = OnnxRunner(path)
    tensors = {lid: v["tensor"] for lid, v in layers.items()}

    def run(idx, replace, keep=tensors):
        feeds = {layers[k]["tensor"]: quantize_like(v, layers[k])
                 for k, v in (replace or {}).items() if k in layers}  # fmt: skip
        out, values = _run_fed(runner, inputs(idx), keep, feeds, at)
        return out, {lid: dequantize(v, layers[lid]) for lid, v in values.items()}

    output = _outputs_only(runner, run)
    return StageModel(stage, run, _scales(layers), forget=runner.forget_cuts, outputs_only=output)


def _outputs_only(runner: OnnxRunner, run: Callable) -> Callable:
    """``run`` (a graph's) keeping no layer tensor: on the reference evaluator always (the
    same evaluator, told to keep less); on onnxruntime only with ``replace`` (the cut graph's
    runner is built for those runs alone), since without it a session of the graph without
    the layer outputs would be a second copy of its weights."""

    def output(idx, replace):
        whole = not replace and runner.backend == "onnxruntime"
        return run(idx, replace)[0] if whole else run(idx, replace, {})[0]

    return output


def program(
    stage: str, path, feed, layers: dict, feedable: bool = False, at: int = 0
) -> StageModel:
    """A .hbm on the simulator (outputs and captured layers, dequantized); ``feed(idx)``
    gives the program's inputs, a tuple in the program's input order or a dict by name. A program
    fed evaluation featuremaps (its only input) is ``feedable``: ``replace={"input:<name>":
    x}`` feeds it the dequantized ``x`` instead, e.g. the input the camera path made. Its
    output ``at`` is compared."""
    executor = Executor(hbm.load(path))

    def run(idx, replace):
        fed = [v for k, v in (replace or {}).items() if k.startswith("input:")]
        got = (np.asarray(fed[0], np.float32),) if fed and feedable else feed(idx)
        got = got if isinstance(got, dict) else dict(zip(executor.program.inputs, got, strict=True))
        outs, values = executor.run(got, capture=True)
        out = np.asarray(list(outs.values())[at], dtype=np.float32)
        return out, {lid: dequantize(v, layers[lid]) for lid, v in values.items() if lid in layers}

    return StageModel(stage, run, _scales(layers), substitutable=False, feedable=feedable)


def _scales(layers: dict) -> dict[str, float]:
    return {k: max(v["scale"]) for k, v in layers.items()}


def _run_fed(runner: OnnxRunner, x, tensors: dict[str, str], feeds: dict, at: int) -> Captured:
    """(output ``at``, {layer id: value}) with ``feeds`` substituted; a fed layer reports what
    its node computed from the fed inputs (``<tensor>#computed``)."""
    r = runner.with_inputs(tuple(feeds)) if feeds else runner
    names = {lid: t + COMPUTED if t in feeds else t for lid, t in tensors.items()}
    outs, values = r.run_capture(x, list(dict.fromkeys(names.values())), feeds)
    return np.asarray(outs[at]), {lid: np.asarray(values[n]) for lid, n in names.items()}


LOADERS = {
    "prepare": torch_model,
    "calibrate": torch_model,
    "qat": torch_model,
    "pre_export": torch_model,
    "export": onnx_model,
    "convert": integer_model,
    "compile": hbm_model,
    "board_sim": hbm_model,
}
"""Stage name -> loader of its model (prepare's: the float model, quantizers in FLOAT)."""
