"""The batch of a model with several inputs (stages/ptq/batch.py): read from every input's
dim 0, made dynamic on all of them, proven against the file run frame by frame."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import StageError
from stages.ptq import batch
from stages.ptq.original import check_model
from tests.stages.ptq import batch_models


def _feeds(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.normal(0, 1, (n, 1, 8, 8)).astype(np.float32),
            "m": rng.normal(0, 1, (n, 4)).astype(np.float32)}  # fmt: skip


@pytest.mark.parametrize("bx, bm", [(1, 1), ("N", 1), (1, "N")])
def test_every_inputs_batch_is_read_and_made_dynamic(bx, bm):
    source = check_model(batch_models.two_inputs(bx, bm), "two.onnx")
    batched = batch.dynamic_batch(source, {})
    assert batched.fixed == 1
    assert batched.rewrites == ["Reshape f: input 1 = [-1, 16]"]
    dims = [i.type.tensor_type.shape.dim[0].dim_param for i in batched.model.graph.input]
    assert dims == ["batch", "batch"]
    assert batch.prove_same(source, batched.model, _feeds(6), batch.fixed_batch(source)) == 0.0


def test_inputs_fixing_different_batches_are_refused_naming_them_and_the_field():
    source = check_model(batch_models.two_inputs(1, 2), "two.onnx")
    with pytest.raises(StageError) as e:
        batch.dynamic_batch(source, {})
    assert "inputs fix different batches (dim 0): x [1, 1, 8, 8], m [2, 4]" in e.value.what
    assert e.value.where == "model.input_shapes / inputs x, m"


def test_input_shapes_giving_different_batches_are_refused():
    source = check_model(batch_models.two_inputs("N", "N"), "two.onnx")
    with pytest.raises(StageError, match=r"model.input_shapes gives different batches"):
        batch.dynamic_batch(source, {"x": [1, 1, 8, 8], "m": [2, 4]})
