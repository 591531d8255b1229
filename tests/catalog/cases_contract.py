"""Bad datasets under the v2 contract for the catalog (tests/catalog/test_bad_inputs.py):
each error names the split, the input or the labels, and the sample."""

from __future__ import annotations

import numpy as np

from schemas.errors import SpecError, StageError
from schemas.spec import parse_spec
from stages.context import RunContext
from tests.conftest import tiny_spec_dict
from tests.models import data as tiny_data

HERE = "tests.catalog.cases_contract"


def _v2(split: str, inputs=None, labels="keep") -> dict:
    d = {k: {"inputs": {"x": x}, "labels": y} for k, (x, y) in tiny_data().items()}
    if inputs is not None:
        d[split]["inputs"] = inputs
    if not isinstance(labels, str):
        d[split]["labels"] = labels
    return d


def missing_input() -> dict:
    return _v2("evaluation", {"image": tiny_data()["evaluation"][0]})


def string_input() -> dict:
    return _v2("evaluation", {"x": np.full((64, 1, 8, 8), "0.5")})


def integer_input() -> dict:
    """int64 inputs the float model's conv refuses."""
    return _v2("evaluation", {"x": np.zeros((64, 1, 8, 8), np.int64)})


def three_channels() -> dict:
    return _v2("evaluation", {"x": np.zeros((64, 3, 8, 8), np.float32)})


def calibration_shape() -> dict:
    return _v2("train", {"x": np.zeros((96, 1, 9, 9), np.float32)})


def column_labels() -> dict:
    return _v2("evaluation", labels=tiny_data()["evaluation"][1][:, None])


def labels_out_of_range() -> dict:
    y = tiny_data()["train"][1].copy()
    y[7] = 10
    return _v2("train", labels=y)


def _checked(fn: str, **compare):
    """The splits as a run reads them: loaded, then checked against the float model."""
    data = {**tiny_spec_dict()["data"], "dataset": f"{HERE}:{fn}"}
    spec = parse_spec(tiny_spec_dict(data=data, compare=compare), "t")
    return RunContext(spec=spec, run=None, code_version="").splits


def cases() -> dict:
    return {
        "v2 input name not a forward parameter": (lambda e: _checked("missing_input"),
                                                  StageError, "no input 'x'"),
        "v2 input of strings": (lambda e: _checked("string_input"), StageError,
                                "data.evaluation.inputs.x"),
        "v2 integer input to a float model": (lambda e: _checked("integer_input"), StageError,
                                              "data.evaluation.inputs.x[0]"),
        "v2 input of the wrong shape": (lambda e: _checked("three_channels"), StageError,
                                        "sample 0 of split 'evaluation'"),
        "v2 splits of different shapes": (lambda e: _checked("calibration_shape"), StageError,
                                          "data.train.inputs.x[0]"),
        "v2 labels of shape (N, 1)": (lambda e: _checked("column_labels"), StageError,
                                      "data.evaluation.labels"),
        "v2 label out of range": (lambda e: _checked("labels_out_of_range"), StageError,
                                  "sample 7 of split 'train'"),
        "compare.primary not recorded": (lambda e: parse_spec(tiny_spec_dict(
            compare={"primary": "miou"}), "s.yaml"), SpecError, "compare.primary"),
    }  # fmt: skip
