"""What evaluates quantized.onnx over the whole evaluation split: the compiled kernels,
once proven equal to the reference evaluator, else the reference evaluator itself.

The reference evaluator (onnx's, with the numpy integer ops of :mod:`simulator.arith`) is
the definition of the integer graph but costs about 0.3 s a frame at 224x224. The
simulator runs the same integers two orders of magnitude faster. So convert compiles
quantized.onnx in memory with compile's own compiler (:func:`stages.compile.build_program`)
and proves the executor that will give the metrics on the evaluation's own batch
geometries (:func:`stages.exactness.check_evaluation`: its first batch through every path
the executor takes, and its last when smaller), outputs bit for bit against the reference
evaluator. Only then does the executor give convert's metrics; when the graph does not
compile, or any output differs, the reference evaluator runs every batch, and
``debug/convert_evaluation.txt`` says which ran and why. Layer capture, substitution
(sensitivity) and the saturation check stay on the reference evaluator.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx

from simulator.runtime.executor import Executor
from stages.compile import build_program, check_on_evaluation, program_outputs
from stages.context import RunContext
from stages.exactness import render_runs
from stages.onnx_runner import OnnxRunner
from stages.outputs import numpy_fed

REFERENCE = "the reference evaluator (onnx's, numpy integer ops) on every batch"


def integer_evaluator(
    ctx: RunContext, path: Path, model: onnx.ModelProto, layers: dict
) -> tuple[Callable, str]:
    """(a model as ``stage_metrics`` calls it, the text of debug/convert_evaluation.txt)."""
    runner = OnnxRunner(path)
    reference = numpy_fed(runner.run)
    if len(ctx.evaluation) <= ctx.spec.data.batch_size:
        return reference, f"{REFERENCE}: the evaluation is one batch, the proof would be all of it"
    try:
        executor = Executor(build_program(path, model, layers, ctx))
        against = "quantized.onnx's reference evaluator"
        runs = check_on_evaluation(executor, runner, ctx, "convert", against)
    except Exception as e:  # noqa: BLE001 (any failure means: not proven, use the reference)
        return reference, f"{REFERENCE}: the compiled kernels were not used ({e})"
    run = numpy_fed(lambda xs: program_outputs(executor, xs))
    return run, (
        "the compiled kernels (quantized.onnx compiled in memory for the simulator), proven "
        "bit-exact against the reference evaluator first: " + render_runs(runs)
    )
