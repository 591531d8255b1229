"""analysis.tolerance: the camera input's modelled rounding is a true bound of the board's
input path (the folded mean/std conv in the board's integers) against the featuremaps."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.tolerance import EPS, camera_limit
from schemas.spec import parse_spec
from simulator.arith import board_input as bi
from simulator.arith.fixedpoint import qrange, round_half_even
from simulator.arith.intmath import fixed_multiplier, requantize
from stages.board_program import camera_inputs
from tests.conftest import tiny_spec_dict


def _spec(runtime: str, color: str, mean: float, std: float):
    data = tiny_spec_dict()["data"] | {"input_format": "rgb", "mean": [mean] * 3, "std": [std] * 3}
    return parse_spec(
        tiny_spec_dict(
            data=data, stages={"board_sim": {"runtime_format": runtime, "color": color}}
        ),
        "s.yaml",
    )


def _steps_apart(frames, runtime, color, mean, std, dtype) -> tuple[int, float]:
    """Most input steps between the featuremap QUANTIZE of ``(frame - mean) / std`` and the
    board's camera path + folded conv (stages/board_program.py) on the same frames; the
    input step."""
    lo, hi = qrange(dtype)
    step = max(mean, 255.0 - mean) / std / hi
    x = (frames.astype(np.float32) - np.float32(mean)) / np.float32(std)
    featuremap = np.clip(round_half_even(x / np.float32(step)), lo, hi)
    attrs = {"runtime_format": runtime, "training_format": "rgb", "color": color}
    feed = camera_inputs(frames, runtime, color)
    centered = bi.preprocess(feed.get("camera", feed), attrs).astype(np.int64)
    weight, bias = bi.fold_mean_std([mean] * 3, [std] * 3, step)
    mult, shift = fixed_multiplier(weight.reshape(-1) / bi.FOLD_WEIGHT, 31, "half_even")
    acc = bi.FOLD_WEIGHT * centered + bi.folded_bias(weight, bias)
    board = requantize(acc, mult, shift, dtype, "half_even", axis=-1)
    return int(np.abs(board - featuremap).max()), step


@pytest.mark.parametrize(
    ("runtime", "color", "mean", "std", "dtype"),
    [
        ("rgb", "bt601_full", 100.0078125, 58.0, "int16"),  # the bias lands on a tie
        ("rgb", "bt601_full", 123.675, 58.395, "int16"),
        ("yuv444", "bt601_video", 100.0078125, 58.0, "int16"),
        ("yuv444", "bt601_full", 127.5, 127.5, "int8"),
        ("bgr", "bt601_full", 127.5, 127.5, "int8"),
    ],
)
def test_camera_limit_bounds_what_the_board_input_path_does(runtime, color, mean, std, dtype):
    """A clean camera run's input never exceeds the limit the localizer allows it."""
    frames = np.random.default_rng(5).integers(0, 256, (16, 8, 8, 3), dtype=np.uint8)
    off, step = _steps_apart(frames, runtime, color, mean, std, dtype)
    assert off <= camera_limit(_spec(runtime, color, mean, std), step) + EPS


def test_an_int16_input_gets_the_folded_bias_rounding_in_its_limit():
    """With an int16 input the folded conv's bias (the mean to 1/64 pixel) alone moves the
    input two steps: a one-step limit called a clean camera run divergent."""
    frames = np.random.default_rng(5).integers(0, 256, (16, 8, 8, 3), dtype=np.uint8)
    off, step = _steps_apart(frames, "rgb", "bt601_full", 100.0078125, 58.0, "int16")
    assert off == 2
    assert 2.0 <= camera_limit(_spec("rgb", "bt601_full", 100.0078125, 58.0), step) < 3.0


def test_a_featuremap_board_has_no_camera_limit():
    spec = parse_spec(tiny_spec_dict(), "s.yaml")
    assert camera_limit(spec, 0.01) is None
