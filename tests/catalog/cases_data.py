"""Bad data and bad models for the catalog (tests/catalog/test_bad_inputs.py)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from schemas.errors import SimulatorError, SpecError, StageError
from schemas.spec import parse_spec
from stages.data import load_splits
from tests.conftest import tiny_spec_dict
from tests.models import data as tiny_data

HERE = "tests.catalog.cases_data"


def _with(split: str, x=None, y=None) -> dict:
    d = tiny_data()
    ox, oy = d[split]
    d[split] = (ox if x is None else x, oy if y is None else y)
    return d


def nan_data() -> dict:
    x = tiny_data()["evaluation"][0].copy()
    x[3, 0, 0, 0] = np.nan
    return _with("evaluation", x)


def inf_calibration() -> dict:
    x = tiny_data()["train"][0].copy()
    x[5, 0, 1, 1] = np.inf
    return _with("train", x)


def empty_evaluation() -> dict:
    return _with("evaluation", np.zeros((0, 1, 8, 8), np.float32), np.zeros(0, np.int64))


def float_labels() -> dict:
    y = tiny_data()["evaluation"][1].astype(np.float32)
    return _with("evaluation", y=y)


def short_labels() -> dict:
    return _with("evaluation", y=tiny_data()["evaluation"][1][:10])


def not_a_dict():
    return [1, 2, 3]


def no_train_split() -> dict:
    return {"evaluation": tiny_data()["evaluation"]}


def bad_camera() -> dict:
    return {**tiny_data(), "camera_evaluation": np.zeros((64, 8, 8), np.float32)}


class Untraceable(nn.Module):
    """Control flow on a tensor value: torch.export cannot trace it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        y = self.conv(x)
        if y.sum() > 0:
            y = y * 2
        return self.head(y.flatten(1))


def untraceable() -> nn.Module:
    torch.manual_seed(0)
    return Untraceable()


def _splits(fn: str):
    return load_splits(f"{HERE}:{fn}", 32, 32)


def _batches(fn: str, split: str):
    return list(_splits(fn)[split].batches(16))


def _prepare(env, factory: str):
    from schemas.store import RunStore
    from stages.context import RunContext
    from stages.prepare import prepare
    from stages.registry_types import StageCall

    spec = parse_spec(tiny_spec_dict(model={"factory": factory}), "t")
    run = RunStore(env.tmp / "scratch-runs").create_run(spec.name, "", "0" * 64, "", {}, {})
    ctx = RunContext(spec=spec, run=run, code_version="")
    return prepare(None, ctx, StageCall("prepare", "0" * 64, "0" * 64, "", {}))


def _zero_scale():
    from simulator.arith.intmath import fixed_multiplier

    return fixed_multiplier(0.0, 15)


def cases() -> dict:
    return {
        "nan in evaluation data": (lambda e: _batches("nan_data", "evaluation"), StageError,
                                   "sample 3"),
        "inf in calibration data": (lambda e: _batches("inf_calibration", "calibration"),
                                    StageError, "sample 5"),
        "empty dataset": (lambda e: _splits("empty_evaluation"), StageError, "data.evaluation"),
        "float labels": (lambda e: _splits("float_labels"), StageError, "labels float32"),
        "labels do not pair up": (lambda e: _splits("short_labels"), StageError, "10 labels"),
        "dataset returns a list": (lambda e: _splits("not_a_dict"), StageError, "data.dataset"),
        "dataset without train": (lambda e: _splits("no_train_split"), StageError, "'train'"),
        "camera frames not uint8 RGB": (lambda e: _splits("bad_camera"), StageError,
                                        "data.camera_evaluation"),
        "zero calibration samples": (lambda e: parse_spec(tiny_spec_dict(data={
            **tiny_spec_dict()["data"], "calibration_samples": 0}), "s.yaml"), SpecError,
            "data.calibration_samples"),
        "factory import error": (lambda e: _prepare(e, "tests.nothere:build"), SpecError,
                                 "model.factory"),
        "untraceable model": (lambda e: _prepare(e, f"{HERE}:untraceable"), StageError, "prepare"),
        "unsupported op": (lambda e: _prepare(e, "tests.models:cumsum"), StageError, "cumsum"),
        "zero scale": (lambda e: _zero_scale(), SimulatorError, "ratio"),
    }  # fmt: skip
