"""A batch fixed by the file made dynamic (stages/ptq/generalize.py), proven against the
file run frame by frame (stages/ptq/batch.py)."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import StageError
from stages.ptq import batch
from stages.ptq.batch_rules import merged_axis
from stages.ptq.generalize import generalize
from stages.ptq.original import check_model, unsupported
from tests.models import data
from tests.stages.ptq import batch_models


def _generalized(model, fixed: int):
    source = check_model(model, "m.onnx")
    batched = batch.dynamic_batch(source, {})
    assert batched.fixed == fixed and unsupported(batched.model) == []
    x = data()["evaluation"][0][:6]
    assert batch.prove_same(source, batched.model, x, fixed) == 0.0
    dim = batched.model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param == "batch"
    return batched


@pytest.mark.parametrize("fixed", [1, 2])
def test_a_fixed_batch_class_token_is_expanded_to_the_batch_at_run_time(fixed):
    batched = _generalized(batch_models.class_token(fixed), fixed)
    ops = [n.op_type for n in batched.model.graph.node]
    assert ops[3:7] == ["Shape", "Concat", "Expand", "Concat"]
    assert batched.rewrites[0] == "Reshape t: input 1 = [-1, 4, 4]"
    assert "expanded to the batch, Shape(x)[0:1]" in batched.rewrites[1]


def test_fixed_resize_sizes_become_spatial_sizes():
    batched = _generalized(batch_models.upsample(1), 1)
    resize = batched.model.graph.node[-1]
    assert [a.ints for a in resize.attribute if a.name == "axes"] == [[2, 3]]


def test_an_as_strided_gather_of_every_element_becomes_a_reshape():
    batched = _generalized(batch_models.strided(1), 1)
    assert [n.op_type for n in batched.model.graph.node] == [
        "Conv", "GlobalAveragePool", "Reshape", "Reshape", "Flatten", "MatMul"]  # fmt: skip


@pytest.mark.parametrize(
    "s, p, inner, out, want",
    [
        ([5, 1, 768], 1, 1, [5, 12, 64], (1, 12)),  # attention heads split: [N, B*H, d]
        ([5, 1, 768], 1, 1, [5, 768], (0, 1)),  # a linear layer's flattening: [N*B, E]
        ([5, 1, 12, 64], 1, 1, [5, 768], (0, 1)),
        ([5, 768], 0, 1, [5, 1, 768], (1, 1)),  # back from [N*B, E]: a standalone axis
        ([1, 2, 2, 7, 7, 96], 0, 1, [4, 7, 7, 96], (0, 4)),  # swin windows: [B*nW, ...]
        ([4, 7, 7, 96], 0, 4, [1, 2, 2, 7, 7, 96], (0, 1)),
        ([5, 7], 0, 1, [7, 5], None),
    ],
)  # fmt: skip
def test_the_axis_a_reshape_merges_the_batch_into(s, p, inner, out, want):
    assert merged_axis(s, p, inner, out, 1) == want


def test_a_node_along_the_batch_is_refused_naming_it_and_the_field():
    source = check_model(batch_models.first_frame(), "m.onnx")
    with pytest.raises(StageError, match=r"fixes the batch at 1 and Gather node 'frame0'"):
        generalize(source, 1)
    with pytest.raises(StageError) as e:
        batch.dynamic_batch(source, {})
    assert e.value.where == "model.input_shapes / node frame0"
    assert "dynamic batch" in e.value.hint


def test_a_rewrite_that_changes_the_outputs_is_refused_naming_the_output():
    source = check_model(batch_models.class_token(1), "m.onnx")
    wrong = check_model(batch_models.class_token(1), "m.onnx")
    wrong.graph.initializer[2].float_data[:] = []  # another position embedding
    wrong.graph.initializer[2].raw_data = np.ones((1, 5, 4), np.float32).tobytes()
    wrong = batch.dynamic_batch(wrong, {}).model
    with pytest.raises(StageError, match=r"output 'y' differs") as e:
        batch.prove_same(source, wrong, data()["evaluation"][0][:4], 1)
    assert e.value.where == "model.input_shapes / output y"


def test_input_shapes_dim_0_fixes_the_batch_when_the_dynamic_sizes_do_not_fold():
    """A target ``[4B, -1, 4, 4]`` has no dynamic form (two inferred entries): with the
    batch fixed at input_shapes' 1 it folds, and the walk makes it ``[-1, 4, 4, 4]``."""
    source = check_model(batch_models.windows(rest=(-1, 4, 4)), "m.onnx")
    assert [n.op_type for n in unsupported(batch.dynamic_batch(source, {}).model)] == ["Shape"]
    batched = batch.dynamic_batch(source, {"x": [1, 1, 8, 8]})
    assert batched.fixed == 1 and unsupported(batched.model) == []
    assert batched.rewrites[0] == "Reshape win: input 1 = [-1, 4, 4, 4]"
    assert batch.prove_same(source, batched.model, data()["evaluation"][0][:4], None) == 0.0


def test_fewer_frames_than_the_fixed_batch_cannot_prove_it():
    source = check_model(batch_models.class_token(2), "m.onnx")
    model = batch.dynamic_batch(source, {}).model
    with pytest.raises(StageError, match="fixes the batch at 2") as e:
        batch.prove_same(source, model, data()["evaluation"][0][:1], 2)
    assert e.value.where == "data.evaluation_samples"
