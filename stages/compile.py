"""compile: quantized.onnx -> .hbm for the simulated BPU (fusion, NHWC, padding, packing).

Compile must not change a number: after compiling, the program and quantized.onnx are run
on probe samples (:func:`stages.exactness.check_exact`: the program through every path
the executor takes, kernels, replays and the frozen plan) and every layer the program holds
and every model output must be bit-identical; then the executor that gives the metrics is
checked on the evaluation's own batch geometries (its first batch through every path, its
last when smaller: :func:`stages.exactness.check_evaluation`), outputs against
quantized.onnx's. Else the stage fails naming the first layer or output that differs, the
path and the batch; debug/bit_exact.txt says what was compared.
debug/hbm.txt lists the instructions with the layer ids they cover; debug/latency.txt is
the cost model's per-layer estimate. When the board's camera delivers something other than
a featuremap, compile also writes board.hbm: the same program behind the board's input
path (stages.board_program).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx

from schemas.artifacts import HbmModel, QuantizedModel
from simulator.program import cost, hbm, hbm_render
from simulator.program.march import MARCHES
from simulator.runtime.executor import Executor
from stages.board_program import board_program
from stages.compile_graph import Compiler
from stages.context import RunContext
from stages.evaluate import stage_metrics
from stages.exactness import batch_ranges, check_evaluation, check_exact
from stages.onnx_runner import OnnxRunner
from stages.outputs import numpy_fed
from stages.registry_types import StageCall


def compile_model(upstream: QuantizedModel, ctx: RunContext, call: StageCall) -> HbmModel:
    """Compile, prove bit-exactness on probe samples, evaluate on the simulated BPU."""
    path = ctx.run.path(upstream.onnx_file)
    layers = json.loads(ctx.run.path(upstream.layers_file).read_text())
    march = MARCHES[ctx.spec.quant.march]
    program = build_program(path, onnx.load(str(path)), layers, ctx)
    out = ctx.artifact_dir("compile") / "model.hbm"
    hbm.save(program, out)
    program = hbm.load(out)
    ctx.write_debug("hbm.txt", hbm_render.render(program))
    probe = ctx.evaluation.arrays(0, max(ctx.spec.compare.probe_samples, 2))
    exact = check_exact(program, ctx.run.root, upstream, probe, "compile")
    executor = Executor(program)
    proof = check_on_evaluation(executor, OnnxRunner(path), ctx)
    exact = dataclasses.replace(exact, evaluation=proof)
    ctx.write_debug("bit_exact.txt", exact.render())
    ctx.write_debug("latency.txt", render_latency(program, executor, ctx, march))
    metrics = stage_metrics(
        ctx, "compile", numpy_fed(lambda xs: program_outputs(executor, xs)), graph=True
    )
    files = ["artifacts/compile/model.hbm"]
    if ctx.spec.stages.board_sim.runtime_format != "featuremap":
        hbm.save(board_program(program, ctx.spec), ctx.run.path("artifacts/compile/board.hbm"))
        files.append("artifacts/compile/board.hbm")
    return call.make(
        HbmModel,
        ctx.run,
        files=files,
        board_file=files[1] if len(files) > 1 else None,
        hbm_file=files[0],
        march=march.name,
        instructions=len(program.instructions),
        fused=[list(i.layer_ids) for i in program.instructions if len(i.layer_ids) > 1],
        metrics=metrics,
    )


def build_program(path, model: onnx.ModelProto, layers: dict, ctx: RunContext):
    """The program of quantized.onnx (``model``, read from ``path``; ``layers``: its
    layers.json) for the spec's march, tensor shapes from one reference run."""
    march = MARCHES[ctx.spec.quant.march]
    shapes = tensor_shapes(path, model, ctx.evaluation.arrays(0, 2))
    return Compiler(model, march.name, march.channel_alignment, shapes).run(
        {lid: v["tensor"] for lid, v in layers.items()}
    )


def check_on_evaluation(
    executor: Executor,
    runner: OnnxRunner,
    ctx: RunContext,
    stage: str = "compile",
    against: str = "quantized.onnx",
) -> tuple[tuple[int, str], ...]:
    """The executor that gives ``stage``'s metrics against quantized.onnx's ``runner``
    (``against`` names it), on the evaluation's own batch geometries
    (stages.exactness.check_evaluation)."""
    ev, inputs = ctx.evaluation, executor.program.inputs
    feeds = [dict(zip(inputs, ev.arrays(a, b), strict=True))
             for a, b in batch_ranges(len(ev), ctx.spec.data.batch_size)]  # fmt: skip
    return check_evaluation(
        executor, feeds, lambda f: runner.run(tuple(f.values())), stage, against
    )


def program_outputs(executor: Executor, xs: tuple) -> list[np.ndarray]:
    """The program's outputs (in order) for its inputs ``xs`` (in order)."""
    return list(executor.run(dict(zip(executor.program.inputs, xs, strict=True)))[0].values())


def tensor_shapes(path, model: onnx.ModelProto, x: np.ndarray) -> dict[str, tuple]:
    """Every tensor's shape from one reference run (custom ops have no shape inference)."""
    names = [o for n in model.graph.node for o in n.output if o]
    _, values = OnnxRunner(path).run_capture(x, names)
    return {k: tuple(np.shape(v)) for k, v in values.items()}


def render_latency(program, executor: Executor, ctx: RunContext, march) -> str:
    """debug/latency.txt: the cost model's estimate per layer (a model, not a measurement)."""
    feed = dict(zip(program.inputs, ctx.evaluation.arrays(0, 1), strict=True))
    shapes = executor.buffer_shapes(feed)
    rows = cost.latency_table(program, shapes, march)
    lines = ["# cost model estimate (not a measurement): layer_id | cycles | ddr_bytes | est_us"]
    lines += [
        f"{r['layer_id']} | {r['cycles']} | {r['ddr_bytes']} | {r['est_us']:.2f}" for r in rows
    ]
    return "\n".join(lines) + "\n"
