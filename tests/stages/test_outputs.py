"""Canonical output ids of any forward() result, and the output labels are judged on."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

from schemas.errors import SpecError, StageError
from stages.outputs import flat_outputs, judged_output, output_arrays, positional

T = torch.zeros(2, 3)
Pair = namedtuple("Pair", "boxes scores")


@pytest.mark.parametrize(
    "out, ids",
    [(T, ["output"]),
     ((T, T), ["output.0", "output.1"]),
     ([T], ["output.0"]),
     ({"boxes": T, "scores": (T, T)}, ["output.boxes", "output.scores.0", "output.scores.1"]),
     ((T, {"mask": T}), ["output.0", "output.1.mask"]),
     (Pair(T, T), ["output.boxes", "output.scores"])],
)  # fmt: skip
def test_every_tensor_gets_an_id_from_its_path(out, ids):
    assert list(flat_outputs(out)) == ids


@pytest.mark.parametrize(
    "out, says",
    [({"boxes": T, "name": "face"}, "output.name is str 'face'"),
     ((T, None), "output.1 is NoneType"),
     ((T, [T, 3]), "output.1.1 is int"),
     ((), "returns no tensor")],
)  # fmt: skip
def test_a_leaf_that_is_not_a_tensor_is_named(out, says):
    with pytest.raises(StageError, match="model.factory") as e:
        flat_outputs(out)
    assert says in e.value.message and e.value.hint


def test_output_arrays_keep_the_values():
    got = output_arrays((torch.ones(2, 4), torch.arange(3.0)))
    assert np.array_equal(got["output.1"], [0, 1, 2]) and got["output.0"].shape == (2, 4)


def test_positional_names_a_graphs_outputs_by_the_float_models_ids():
    got = positional(["output.boxes", "output.scores"], [np.zeros(1), np.ones(1)], "convert")
    assert got["output.scores"][0] == 1
    with pytest.raises(StageError, match="convert model has 1 outputs, the float model 2"):
        positional(["output.boxes", "output.scores"], [np.zeros(1)], "convert")


BOX, LANDMARKS, PROB = np.zeros((4, 4)), np.zeros((4, 10)), np.zeros((4, 2))
IMAGE = np.zeros((4, 3, 8, 8))


def test_judged_output_is_named_or_the_class_like_one():
    outs = {"output.0": IMAGE, "output.1": PROB}
    assert judged_output(outs) == "output.1" and judged_output(outs, labelled=True) == "output.1"
    assert judged_output({"output.0": IMAGE}) == "output.0"
    three = {"output.0": BOX, "output.1": LANDMARKS, "output.2": PROB}
    assert judged_output(three) == "output.0"  # without labels: the first, said in reports
    assert judged_output(three, "output.2", labelled=True) == "output.2"


def test_labels_with_several_class_like_outputs_need_compare_output():
    three = {"output.0": BOX, "output.1": LANDMARKS, "output.2": PROB}
    with pytest.raises(SpecError, match="compare.output") as e:
        judged_output(three, labelled=True)
    assert "output.0, output.1, output.2" in e.value.message
    with pytest.raises(SpecError, match="'output.3' is not an output"):
        judged_output(three, "output.3")
