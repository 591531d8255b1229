"""The data against the model: forward parameter names, the model's refusal, labels that
do not fit its output; each error names the split, the input or the labels, the sample."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from schemas.errors import StageError
from stages.data import Split
from stages.data_check import check_labels, check_with_model, forward_inputs


class TwoArgs(nn.Module):
    def forward(self, image, scale=1.0, *rest, **options):
        return image.flatten(1) * scale


class Maps(nn.Module):
    def forward(self, x):
        return x  # one value per position: no class scores


def _splits(x, labels=None) -> dict:
    return {"evaluation": Split("evaluation", {"image": x}, labels)}


def test_forward_inputs_are_the_parameters_without_a_default():
    assert forward_inputs(TwoArgs()) == ["image"]
    assert forward_inputs(nn.Sequential(nn.Identity())) == ["input"]


def test_labels_need_class_scores_and_a_class_in_range():
    x = np.zeros((4, 3), np.float32)
    check_with_model(_splits(x, np.array([0, 1, 2, 2])), TwoArgs())
    with pytest.raises(StageError, match=r"label 3 of sample 1 of split 'evaluation'") as e:
        check_with_model(_splits(x, np.array([0, 3, 2, -1])), TwoArgs())
    assert e.value.where == "data.evaluation.labels[1]"
    with pytest.raises(StageError, match=r"output is \(3, 2\) per sample") as e:
        check_labels(Split("evaluation", {"x": x}, np.zeros(4, np.int64)), np.zeros((4, 3, 2)))
    assert "data.metric" in e.value.hint


def test_the_model_refusing_an_input_names_the_input_and_the_sample():
    conv = nn.Conv2d(1, 2, 3)
    with pytest.raises(StageError, match="refused sample 0 of split 'evaluation'") as e:
        check_with_model(_splits(np.zeros((4, 3, 5, 5), np.float32)), conv)
    assert e.value.where == "data.evaluation.inputs.image[0]" and "(3, 5, 5)" in e.value.what
    assert isinstance(e.value.__cause__, RuntimeError)


def test_every_split_has_the_evaluation_inputs_shape():
    good, bad = np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)
    splits = {**_splits(good), "train": Split("train", {"image": bad})}
    with pytest.raises(StageError, match="of split 'train' is float32 \\(2,\\)") as e:
        check_with_model(splits, Maps())
    assert e.value.where == "data.train.inputs.image[0]"
