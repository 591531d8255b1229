"""The PTQ chain's batch and task metric (stages/ptq/batch.py, data.metric of a PTQ spec):
inputs fixing different batches, a task metric that is missing, raises or returns
non-floats."""

from __future__ import annotations

from schemas.errors import StageError


def _batches_disagree(env):
    from stages.ptq import batch
    from stages.ptq.original import check_model
    from tests.stages.ptq.batch_models import two_inputs

    batch.dynamic_batch(check_model(two_inputs(1, 2), "two.onnx"), {})


def cases() -> dict:
    return {
        "ptq inputs fix different batches": (_batches_disagree, StageError, "x [1, 1, 8, 8]"),
    }
