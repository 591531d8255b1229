"""prepare: float model -> QAT model (BN folded, fake quant inserted per the policy).

Writes debug/fx_graph.txt and debug/model_check_result.txt; an unsupported op stops the
stage after the report is written. Records the float model's metrics and the prepared
model's with every quantizer in FLOAT state (which must equal float: only BN folding
happened; stages.evaluate).
"""

from __future__ import annotations

import json

from schemas.artifacts import PreparedModel
from stages.context import RunContext, toolchain_settings
from stages.evaluate import measure, stage_metrics
from stages.fake_quant import QuantState, set_model_state
from stages.model_check import folded_layers, render_check, render_fx_graph
from stages.modelio import UnsupportedOps, save_state
from stages.registry_types import StageCall


def prepare(upstream: None, ctx: RunContext, call: StageCall) -> PreparedModel:
    """Build the QAT model of the spec's float model and report what was found."""
    model, ev = ctx.float_model, ctx.evaluation
    judged = ctx.spec.compare.output
    float_metrics = measure(
        "float", ctx.reference, ctx.reference, ev.labels, ctx.task_metric, judged
    )
    try:
        gm, infos, roles = ctx.prepared_qat()
    except UnsupportedOps as e:
        ctx.write_debug("model_check_result.txt", render_check(e.infos, None, None))
        raise
    ctx.write_debug("fx_graph.txt", render_fx_graph(gm))
    ctx.write_debug("model_check_result.txt", render_check(infos, gm, roles))
    set_model_state(gm, QuantState.FLOAT)
    prepared_metrics = stage_metrics(ctx, "prepare", gm, nhwc=True)  # a float model now
    out = ctx.artifact_dir("prepare")
    save_state(model, out / "float.safetensors")
    save_state(gm, out / "qat.safetensors")
    _write_layers(ctx, infos, gm)
    return call.make(
        PreparedModel,
        ctx.run,
        files=[
            "artifacts/prepare/float.safetensors",
            "artifacts/prepare/qat.safetensors",
            "artifacts/prepare/layers.json",
        ],
        factory=ctx.spec.model.factory,
        example_shape=list(ctx.evaluation.x[:2].shape),
        settings=toolchain_settings(ctx.spec),
        quant_state="float",
        state_file="artifacts/prepare/qat.safetensors",
        metrics=[*float_metrics, *prepared_metrics],
    )


def _write_layers(ctx: RunContext, infos, gm) -> None:
    """artifacts/prepare/layers.json: every op of the float graph, its id and category,
    topological index, and the layer it was merged into (BN folding), if any."""
    folded = folded_layers(infos, gm)
    layers = [
        dict(
            i.__dict__,
            category=i.category and str(i.category),
            topo_index=k,
            merged_into=folded.get(i.layer_id),
        )
        for k, i in enumerate(infos)
    ]
    ctx.run.write_text("artifacts/prepare/layers.json", json.dumps(layers, indent=1))
