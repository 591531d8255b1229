"""Files whose batch the PTQ chain's original cannot make dynamic (stages/ptq/batch.py)."""

from __future__ import annotations

from schemas.errors import StageError


def _dynamic_batch(model, input_shapes=None):
    from stages.ptq import batch
    from stages.ptq.original import check_model

    return batch.dynamic_batch(check_model(model, "m.onnx"), input_shapes or {})


def _gather_frame_0(env):
    from tests.stages.ptq import batch_models

    return _dynamic_batch(batch_models.first_frame())


def _shape_left(env):
    from stages.ptq.original import refuse, unsupported
    from tests.stages.ptq import batch_models

    batched = _dynamic_batch(batch_models.windows(rest=(-1, 4, 4)))
    raise refuse(unsupported(batched.model), "win.onnx")


def cases() -> dict:
    return {
        "ptq batch fixed and a gather of frame 0": (_gather_frame_0, StageError, "frame0"),
        "ptq size computation that follows the batch": (_shape_left, StageError, "Shape"),
    }
