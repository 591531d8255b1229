"""The PTQ chain's batch and task metric (stages/ptq/batch.py, data.metric of a PTQ spec):
inputs fixing different batches, a task metric that is missing, raises or returns
non-floats."""

from __future__ import annotations

import numpy as np

from schemas.errors import SpecError, StageError


def _batches_disagree(env):
    from stages.ptq import batch
    from stages.ptq.original import check_model
    from tests.stages.ptq.batch_models import two_inputs

    batch.dynamic_batch(check_model(two_inputs(1, 2), "two.onnx"), {})


def _task_metric(env, ref: str):
    """A PTQ stage's metrics of an output with the task metric ``ref``."""
    from stages.evaluate import judge
    from stages.ptq.context import PtqContext

    ctx = PtqContext(None, "m", env.tmp / "m.onnx", None, None, {}, metric=ref)
    out = {"output": np.ones((2, 3), np.float32)}
    judge("ptq", out, out, None, ctx.task_metric, ctx.compare)


def cases() -> dict:
    return {
        "ptq inputs fix different batches": (_batches_disagree, StageError, "x [1, 1, 8, 8]"),
        "ptq data.metric not in its module": (
            lambda e: _task_metric(e, "tests.stages.test_evaluate:no_such"), SpecError,
            "data.metric"),
        "ptq data.metric raises": (
            lambda e: _task_metric(e, "tests.pipelines.test_ptq:_raising"), StageError,
            "data.metric"),
        "ptq data.metric returns no floats": (
            lambda e: _task_metric(e, "tests.pipelines.test_ptq:_not_floats"), StageError,
            "data.metric"),
    }  # fmt: skip
