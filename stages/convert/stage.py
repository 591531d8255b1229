"""convert: qat.onnx -> quantized.onnx (the vendor's quantized.bc), integers throughout.

The arithmetic (multiplier width, requantize rounding, conv+add fusion) comes from the
consistency level and ``stages.convert``, and is recorded in the artifact. The integer
graph is run by the reference executor (numpy kernels of simulator/ behind onnx's reference
evaluator); its metrics (stages.evaluate) are recorded, and layers whose outputs mostly sit at the
integer limits on the calibration samples are listed in debug/convert_advisor.txt.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import onnx

from schemas.artifacts import Metric, QatOnnxModel, QuantizedModel
from schemas.errors import StageError
from schemas.fileio import atomic_save
from simulator.arith import fixedpoint as fp
from stages.context import RunContext, convert_settings
from stages.convert.graph import Converter, QTensor
from stages.evaluate import stage_metrics
from stages.faults import inject_convert
from stages.onnx_export import render_graph_text
from stages.onnx_fold import fold_constant_nodes
from stages.onnx_runner import OnnxRunner
from stages.registry_types import StageCall


def convert(upstream: QatOnnxModel, ctx: RunContext, call: StageCall) -> QuantizedModel:
    """Write the integer graph, evaluate it, and check for saturating layers."""
    settings = convert_settings(ctx.spec)
    try:
        src = onnx.load(str(ctx.run.path(upstream.onnx_file)))
    except Exception as e:  # onnx raises DecodeError and friends
        raise StageError(
            f"cannot read {upstream.onnx_file} ({e})", where="convert", hint="rerun export"
        ) from e
    src, folded = fold_constant_nodes(src)
    converter = Converter(src, settings)
    model, layers = converter.run()
    model = inject_convert(ctx, model, layers)
    out = ctx.artifact_dir("convert")
    _save(model, out / "quantized.onnx")
    ctx.run.write_text("artifacts/convert/layers.json", json.dumps(layer_json(layers), indent=1))
    ctx.write_debug("quantized_onnx.txt", render_graph_text(model))
    runner = OnnxRunner(out / "quantized.onnx")
    warnings = saturation_warnings(runner, layers, ctx)
    ctx.write_debug("convert_advisor.txt", "\n".join(warnings or ["no warnings"]) + "\n")
    from stages.convert.evaluation import integer_evaluator  # it imports compile, which imports us

    evaluator, how = integer_evaluator(ctx, out / "quantized.onnx", model, layer_json(layers))
    ctx.write_debug("convert_evaluation.txt", how + "\n")
    metrics = stage_metrics(ctx, "convert", evaluator, graph=True)
    islands = sorted(converter.islands)
    _report_islands(ctx, islands)
    files = ["artifacts/convert/quantized.onnx", "artifacts/convert/layers.json"]
    n = len(ctx.evaluation)
    return call.make(
        QuantizedModel,
        ctx.run,
        files=files,
        onnx_file=files[0],
        layers_file=files[1],
        settings=asdict(settings),
        float_ops=islands,
        folded_constants=folded,
        warnings=warnings,
        metrics=[
            *metrics,
            Metric(stage="convert", metric="float_islands", value=len(islands), n_samples=n),
        ],
    )


ISLANDS = "## float islands (found at convert; they run on the board's CPU side)"


def _report_islands(ctx: RunContext, islands: list[str]) -> None:
    """Append (or replace) the float-island section of debug/model_check_result.txt."""
    path = ctx.run.path("debug/model_check_result.txt")
    text = path.read_text() if path.exists() else "# model_check_result\n"
    text = text.split(f"\n{ISLANDS}")[0].rstrip("\n") + "\n"
    ctx.write_debug(
        "model_check_result.txt", f"{text}\n{ISLANDS}\n" + "\n".join(islands or ["none"]) + "\n"
    )


def _save(model: onnx.ModelProto, path) -> None:
    atomic_save(path, lambda tmp: onnx.save(model, tmp))


def layer_json(layers: dict[str, QTensor]) -> dict:
    """Layer id -> where its integers are and what they mean."""
    return {
        lid: {
            "tensor": q.name,
            "scale": np.asarray(q.scale).reshape(-1).tolist(),
            "dtype": q.dtype,
            "axis": q.axis,
        }
        for lid, q in layers.items()
    }


def saturation_warnings(
    runner: OnnxRunner,
    layers: dict[str, QTensor],
    ctx: RunContext,
) -> list[str]:
    """Layers whose outputs sit at the integer limits more than the allowed share."""
    cfg = ctx.spec.stages
    limit, n = cfg.convert.saturation_warning, cfg.convert.saturation_samples
    x = ctx.calibration.arrays(0, min(cfg.calibrate.batch_size, n))
    names = {q.name: lid for lid, q in layers.items() if q.dtype in ("int8", "int16")}
    _, values = runner.run_capture(x, list(names))
    out = []
    for name, lid in names.items():
        qmin, qmax = fp.qrange(layers[lid].dtype)
        v = np.asarray(values[name])
        share = float(np.mean((v <= qmin) | (v >= qmax)))
        if share > limit:
            out.append(
                f"{lid} | saturates | {share:.0%} of its {layers[lid].dtype} outputs "
                f"at the limits on {len(x[0])} calibration samples | advice: use int16 for "
                "this layer or recalibrate (percentile/mse observer)"
            )
    return out


def run_integer(
    run_path, art: QuantizedModel, x: np.ndarray
) -> tuple[list[np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The reference integer executor on a batch: (outputs, {layer id: (integers, scale)})."""
    layers = json.loads((run_path / art.layers_file).read_text())
    runner = OnnxRunner(run_path / art.onnx_file)
    outputs, values = runner.run_capture(x, [v["tensor"] for v in layers.values()])
    return outputs, {
        lid: (np.asarray(values[v["tensor"]]), np.asarray(v["scale"])) for lid, v in layers.items()
    }
