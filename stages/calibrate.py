"""calibrate: run the observers over N calibration samples, then freeze the scales.

Quantizer states follow the vendor's FakeQuantState: CALIBRATION (observers on, fake quant
off) while calibrating, VALIDATION (fake quant on, observers off) afterwards.
"""

from __future__ import annotations

import torch

from schemas.artifacts import CalibratedModel, Metric, QatModelArtifact
from stages.context import RunContext
from stages.evaluate import stage_metrics
from stages.fake_quant import QuantState, freeze_model, quantizers, set_model_state
from stages.faults import inject_calibrate
from stages.modelio import load_qat, save_state
from stages.registry_types import StageCall


@torch.no_grad()
def calibrate(upstream: QatModelArtifact, ctx: RunContext, call: StageCall) -> CalibratedModel:
    """Set every scale from calibration data; evaluate in VALIDATION state."""
    gm = load_qat(upstream, ctx)
    set_model_state(gm, QuantState.CALIBRATION)
    split = ctx.calibration
    for start, x, _ in split.batches(ctx.spec.stages.calibrate.batch_size):
        gm(*split.tensors(start, start + len(x)))
    freeze_model(gm)
    inject_calibrate(ctx, gm)
    set_model_state(gm, QuantState.VALIDATION)
    metrics = stage_metrics(ctx, call.stage, gm)
    return save_qat(gm, ctx, call, CalibratedModel, upstream, metrics)


def save_qat(
    gm, ctx: RunContext, call: StageCall, cls, upstream: QatModelArtifact, metrics: list[Metric]
) -> QatModelArtifact:
    """Write a QAT model's state and quantizer listing; return its artifact."""
    stage = call.stage
    state_file = f"artifacts/{stage}/qat.safetensors"
    ctx.artifact_dir(stage)
    save_state(gm, ctx.run.path(state_file))
    listing = "\n".join(f"{fq.name}: {fq.extra_repr()}" for _, fq in quantizers(gm))
    ctx.write_debug(f"{stage}_quantizers.txt", listing + "\n")
    return call.make(
        cls,
        ctx.run,
        files=[state_file],
        factory=upstream.factory,
        example_shape=upstream.example_shape,
        settings=upstream.settings,
        quant_state="validation",
        state_file=state_file,
        metrics=metrics,
    )
