"""Hostile camera runtimes and fault specs for the catalog (tests/catalog/test_bad_inputs.py):
a board camera the model cannot take, mean/std that do not fold, camera frames the board
cannot read, fault amounts that apply nothing or crash a stage.

Every case is cheap: no chain runs. The board program is built from the catalog run's
model.hbm (read, never written); board_sim runs on a scratch copy of the run.
"""

from __future__ import annotations

import numpy as np

from schemas.artifacts import HbmModel
from schemas.errors import SimulatorError, SpecError, StageError
from schemas.spec import parse_spec
from stages.board_program import board_program, camera_inputs
from tests.catalog.cases_files import HBM, _copied_run
from tests.conftest import tiny_spec_dict


def _spec(runtime: str = "nv12", **data):
    fields = {**tiny_spec_dict()["data"], **data}
    sections = {"data": fields, "stages": {"board_sim": {"runtime_format": runtime}}}
    return parse_spec(tiny_spec_dict(**sections), "s.yaml")


def _board(env, runtime: str = "nv12", **data):
    """The board program of the catalog run's model.hbm behind a camera."""
    from simulator.program import hbm

    return board_program(hbm.load(env.run.path(HBM)), _spec(runtime, **data))


def _fault(**fault):
    return parse_spec(tiny_spec_dict(faults=[fault]), "s.yaml")


def _board_sim_without_frames(env):
    """board_sim behind an nv12 camera on a dataset with no camera frames."""
    from stages.board_sim import board_sim
    from stages.context import RunContext
    from stages.registry_types import StageCall

    run = _copied_run(env)
    spec = _spec(input_format="gray")
    ctx = RunContext(spec=spec, run=run, code_version="test")
    upstream = run.load_artifact("compile", HbmModel)
    h = "0" * 64
    return board_sim(upstream, ctx, StageCall("board_sim", h, h, "test"))


def _frames(shape, dtype=np.uint8):
    return np.zeros(shape, dtype=dtype)


def board_cases() -> dict:
    return {
        "camera for a featuremap-trained model": (lambda e: _board(e), SpecError,
                                                  "stages.board_sim.runtime_format"),
        "rgb camera for a yuv444-trained model": (
            lambda e: _board(e, "rgb", input_format="yuv444"), SpecError,
            "cannot take rgb frames"),
        "gray camera for an rgb-trained model": (
            lambda e: _board(e, "gray", input_format="rgb"), SpecError,
            "stages.board_sim.runtime_format"),
        "camera mean of the wrong length": (
            lambda e: _board(e, input_format="gray", mean=[1.0, 2.0, 3.0]), SpecError,
            "data.mean"),
        "camera std of zero": (lambda e: _board(e, input_format="gray", std=[0.0]),
                               SimulatorError, "std and scale > 0"),
        "unknown camera colour standard": (
            lambda e: parse_spec(tiny_spec_dict(stages={"board_sim": {"color": "bt709"}}),
                                 "s.yaml"), SpecError, "stages.board_sim.color"),
        "nv12 frames of odd size": (
            lambda e: camera_inputs(_frames((1, 7, 7, 3)), "nv12", "bt601_full"),
            SimulatorError, "even height and width"),
        "camera frames not uint8": (
            lambda e: camera_inputs(_frames((1, 8, 8, 3), np.float32), "yuv444", "bt601_full"),
            SimulatorError, "board_input.rgb"),
        "camera runtime without camera frames": (_board_sim_without_frames, StageError,
                                                 "data.dataset"),
    }  # fmt: skip


def fault_cases() -> dict:
    return {
        "fault amount not a number": (
            lambda e: _fault(kind="calib_scale", layer="conv", amount=float("nan")), SpecError,
            "finite number"),
        "fault amount infinite": (
            lambda e: _fault(kind="scale_steps", layer="conv", amount=float("inf")), SpecError,
            "finite number"),
        "table coarsening below zero": (
            lambda e: _fault(kind="lut_coarsen", layer="sigmoid", amount=-1), SpecError,
            "whole number >= 0"),
        "fractional shift fault": (
            lambda e: _fault(kind="shift_off", layer="conv", amount=0.5), SpecError,
            "whole number"),
        "camera fault of an unknown kind of swap": (
            lambda e: _fault(kind="preprocess_swap", amount=2), SpecError,
            "0 (RGB <-> BGR) or 1"),
    }  # fmt: skip


def cases() -> dict:
    return {**board_cases(), **fault_cases()}
