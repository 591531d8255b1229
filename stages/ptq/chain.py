"""The PTQ chain's stages: one function each, ``fn(upstream, ctx, call) -> PtqModel``.

:data:`STAGES` lists them in chain order; ``pipelines.ptq`` runs them and records each in
the run's manifest and tables. Every stage writes its vendor-named file (VENDOR_FILES) and
top-1 on the evaluation split; quantized and hbm reuse convert's Converter and compile's
Compiler unchanged, and hbm must equal quantized bit for bit on the probe samples, on
every execution path (compile's check, :func:`stages.exactness.check_exact`), and the
executors that give hbm's and board's metrics are checked on the evaluation's batches
(:func:`stages.exactness.check_evaluation`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import onnx

from schemas.artifacts import Metric
from simulator.program import hbm
from simulator.runtime.executor import Executor
from stages.compile import tensor_shapes
from stages.compile_graph import Compiler
from stages.convert.graph import Converter, ConvertSettings
from stages.convert.stage import ISLANDS, layer_json
from stages.exactness import batch_ranges, check_evaluation, check_exact, render_runs
from stages.onnx_export import render_graph_text
from stages.onnx_runner import OnnxRunner
from stages.ptq import batch, equivalence, feeds, original, ptq, shapes
from stages.ptq import calibrate_onnx as cal
from stages.ptq.context import PtqContext, PtqModel
from stages.ptq.graph import layer_of, save_model
from stages.ptq.optimize import optimize
from stages.registry_types import StageCall


def _save(ctx: PtqContext, stage: str, model: onnx.ModelProto) -> str:
    rel = ctx.file(stage)
    save_model(model, ctx.run.path(rel))
    return rel


def _onnx_metrics(ctx: PtqContext, stage: str, rel: str) -> list[Metric]:
    runner = OnnxRunner(ctx.run.path(rel))
    return ctx.measure(stage, runner.run)


def _load(ctx: PtqContext, art: PtqModel) -> onnx.ModelProto:
    return onnx.load(str(ctx.run.path(art.onnx_file)))


def original_stage(_: None, ctx: PtqContext, call: StageCall) -> PtqModel:
    """Load, fix the input shapes, check, fold the size computations and make the batch
    dynamic (:func:`stages.ptq.batch.dynamic_batch`), assign layer ids; refuse unsupported
    ops after writing the report; prove the rewritten model computes what the file does."""
    source = original.load_model(ctx.source)
    shapes.fix_input_shapes(source, ctx.input_shapes, ctx.source)
    source = original.check_model(source, ctx.source)
    feeds.check_inputs(source, ctx.evaluation, str(ctx.source))
    feeds.refuse_integer_inputs(source, str(ctx.source))
    batched = batch.dynamic_batch(source, ctx.input_shapes)
    model = batched.model
    original.assign_layer_ids(model)
    bad = original.unsupported(model)
    report = original.render_check(model, ctx.source, bad)
    lines = shapes.render_folded(batched.folded) + batch.render(batched, None, 0)
    ctx.write_debug("model_check_result.txt", report + "\n".join(lines) + "\n")
    if bad:
        raise original.refuse(bad, ctx.source)
    if batched.folded.nodes or batched.fixed:
        n = min(max(4, 2 * (batched.fixed or 1)), len(ctx.evaluation))
        x = feeds.take(ctx.evaluation.inputs, slice(n))
        diff = batch.prove_same(source, model, x, batch.fixed_batch(source))
        ctx.append_check(batch.render(batched, diff, n)[-1:])
    rel = _save(ctx, "original", model)
    metrics = _onnx_metrics(ctx, "original", rel)
    return call.make(PtqModel, ctx.run, [rel], onnx_file=rel, metrics=metrics)


def optimized_stage(up: PtqModel, ctx: PtqContext, call: StageCall) -> PtqModel:
    """Equivalent rewrites (pattern fusion among them), then every layer compared with the
    original (cosine); debug/optimize_equivalence.txt lists both."""
    source, patterns = _load(ctx, up), []
    model, removed = optimize(_load(ctx, up), patterns)
    rel = _save(ctx, "optimized", model)
    n = min(max(ctx.probe_samples, 8), len(ctx.calibration))
    x = feeds.take(ctx.calibration.inputs, slice(n))
    rows = equivalence.compare_layers(source, model, x, removed)
    text = equivalence.render_rows(rows, ctx.cosine, patterns)
    ctx.write_debug("optimize_equivalence.txt", text)
    worst = equivalence.check_rows(rows, ctx.cosine)
    ctx.append_check(["", "## optimized: layers removed or folded"]
                     + ([f"{k}: {v}" for k, v in removed.items()] or ["none"]))  # fmt: skip
    metrics = [
        *_onnx_metrics(ctx, "optimized", rel),
        Metric(stage="optimized", metric="min_layer_cosine", value=worst, n_samples=n),
    ]
    return call.make(PtqModel, ctx.run, [rel], onnx_file=rel, removed=removed, metrics=metrics)


def calibrated_stage(up: PtqModel, ctx: PtqContext, call: StageCall) -> PtqModel:
    """QDQ per the quant config, scales from the calibration samples (minmax)."""
    model = _load(ctx, up)
    names = {n.name: layer_of(n) for n in model.graph.node}
    cal.name_by_layer(model)
    plan = cal.plan(model, ctx.quant, names)
    observed = [*plan.inputs, *plan.outputs]
    amax = cal.observe(model, observed, ctx.calibration.inputs, ctx.batch_size)
    model, table = cal.insert_qdq(model, plan, amax, ctx.quant)
    rel = _save(ctx, "calibrated", model)
    ctx.write_debug("ptq_quantizers.txt", cal.render_quantizers(table))
    ctx.write_debug("calibrated_onnx.txt", render_graph_text(model))
    return call.make(PtqModel, ctx.run, [rel], onnx_file=rel,
                     metrics=_onnx_metrics(ctx, "calibrated", rel))  # fmt: skip


def ptq_stage(up: PtqModel, ctx: PtqContext, call: StageCall) -> PtqModel:
    """Table ops to lookup tables; the rest stay float and are reported."""
    model, fixed, islands = ptq.fix_tables(_load(ctx, up), ctx.march)
    rel = _save(ctx, "ptq", model)
    ctx.append_check(ptq.render_tables(fixed, islands))
    ctx.write_debug("ptq_onnx.txt", render_graph_text(model))
    return call.make(PtqModel, ctx.run, [rel], onnx_file=rel, fixed_point=fixed,
                     float_ops=islands, metrics=_onnx_metrics(ctx, "ptq", rel))  # fmt: skip


def quantized_stage(up: PtqModel, ctx: PtqContext, call: StageCall) -> PtqModel:
    """The QAT chain's Converter, unchanged, with the march's multiplier width."""
    settings = ConvertSettings(multiplier_bits=ctx.march.multiplier_bits)
    source = _load(ctx, up)
    converter = Converter(source, settings)
    model, layers = converter.run()
    rel = _save(ctx, "quantized", model)
    layers_rel = "artifacts/quantized/layers.json"
    ctx.run.write_text(layers_rel, json.dumps(layer_json(layers), indent=1))
    ctx.write_debug("quantized_onnx.txt", render_graph_text(model))
    islands = {lid: "float island in the integer graph" for lid in sorted(converter.islands)}
    ctx.append_check(["", ISLANDS, *(islands or ["none"])])
    n = len(ctx.evaluation)
    metrics = [
        *_onnx_metrics(ctx, "quantized", rel),
        Metric(stage="quantized", metric="float_islands", value=len(islands), n_samples=n),
    ]
    return call.make(PtqModel, ctx.run, [rel, layers_rel], onnx_file=rel, layers_file=layers_rel,
                     float_ops=islands, metrics=metrics)  # fmt: skip


def hbm_stage(up: PtqModel, ctx: PtqContext, call: StageCall) -> PtqModel:
    """The QAT chain's Compiler, unchanged; the program must equal quantized bit for bit."""
    path = ctx.run.path(up.onnx_file)
    model = onnx.load(str(path))
    layers = json.loads(ctx.run.path(up.layers_file).read_text())
    shapes = tensor_shapes(path, model, feeds.take(ctx.evaluation.inputs, slice(2)))
    program = Compiler(model, ctx.march.name, ctx.march.channel_alignment, shapes).run(
        {lid: v["tensor"] for lid, v in layers.items()}
    )
    rel = ctx.file("hbm")
    hbm.save(program, ctx.run.path(rel))
    program = hbm.load(ctx.run.path(rel))
    n = min(max(ctx.probe_samples, 2), len(ctx.evaluation))
    x = feeds.ordered(program.inputs, feeds.take(ctx.evaluation.inputs, slice(n)))
    exact = check_exact(program, ctx.run.root, up, x, "hbm")
    executor, runner = Executor(program), OnnxRunner(path)
    runs = check_evaluation(executor, _feeds(ctx), runner.run, "hbm")
    ctx.write_debug("bit_exact.txt", replace(exact, evaluation=runs).render())
    metrics = [
        *ctx.measure("hbm", lambda f: list(executor.run(f)[0].values())),
        Metric(stage="hbm", metric="bit_exact_layers", value=len(exact.layers), n_samples=n),
    ]
    return call.make(PtqModel, ctx.run, [rel], hbm_file=rel, layers_file=up.layers_file,
                     onnx_file=up.onnx_file, metrics=metrics)  # fmt: skip


def _feeds(ctx: PtqContext) -> list[dict]:
    """The evaluation's batch geometries as the PTQ stages feed them (stages.exactness),
    every input by name."""
    ranges = batch_ranges(len(ctx.evaluation), ctx.batch_size)
    return [feeds.take(ctx.evaluation.inputs, slice(a, b)) for a, b in ranges]


def board_stage(up: PtqModel, ctx: PtqContext, call: StageCall) -> PtqModel:
    """The .hbm loaded fresh and run by the simulated BPU on the evaluation inputs; its
    replays and frozen plan checked first against its own kernels (stages.exactness)."""
    executor = Executor(hbm.load(ctx.run.path(up.hbm_file)))
    kernels = lambda f: list(Executor(executor.program).run(f)[0].values())  # noqa: E731
    runs = check_evaluation(executor, _feeds(ctx), kernels, "board", "its kernels")
    ctx.write_debug("board_exact.txt", render_runs(runs) + "\n")
    metrics = ctx.measure("board", lambda f: list(executor.run(f)[0].values()))
    return call.make(PtqModel, ctx.run, [], hbm_file=up.hbm_file, metrics=metrics)


@dataclass(frozen=True)
class PtqStage:
    """One row of the PTQ stage table."""

    name: str
    fn: Callable[[PtqModel | None, PtqContext, StageCall], PtqModel]
    reads: tuple[str, ...]  # data splits whose digest enters the inputs digest


STAGES: tuple[PtqStage, ...] = (
    PtqStage("original", original_stage, ("evaluation",)),
    PtqStage("optimized", optimized_stage, ("calibration", "evaluation")),
    PtqStage("calibrated", calibrated_stage, ("calibration", "evaluation")),
    PtqStage("ptq", ptq_stage, ("evaluation",)),
    PtqStage("quantized", quantized_stage, ("evaluation",)),
    PtqStage("hbm", hbm_stage, ("evaluation",)),
    PtqStage("board", board_stage, ("evaluation",)),
)
"""The PTQ chain in order."""
