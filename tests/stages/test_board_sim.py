"""board_sim: the board's own input path in front of the compiled model."""

import pytest

from schemas.errors import SpecError
from tests.stages.helpers import run_stages

CHAIN = ("prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim")
RGB = {
    "model": {"factory": "tests.models:rgb"},
    "data": {
        "dataset": "tests.models:camera_data",
        "calibration_samples": 64,
        "evaluation_samples": 64,
        "batch_size": 32,
        "input_format": "rgb",
        "mean": [127.5] * 3,
        "std": [127.5] * 3,
    },
}


def _top1(arts, stage):
    return arts[stage].metrics[0].value


def test_rgb_camera_on_rgb_training_agrees_with_compile(make_ctx):
    ctx = make_ctx(**RGB, stages={"board_sim": {"runtime_format": "rgb"}})
    arts = run_stages(ctx, *CHAIN)
    assert arts["compile"].board_file is not None
    # the folded mean/std rounds the input with an integer multiplier, the featuremap path in
    # float32: near-ties may land one input step apart, nothing more
    assert abs(_top1(arts, "board_sim") - _top1(arts, "compile")) <= 2 / 64


def test_nv12_camera_on_rgb_training_diverges(make_ctx):
    ctx = make_ctx(**RGB, stages={"board_sim": {"runtime_format": "nv12"}})
    arts = run_stages(ctx, *CHAIN)
    # random frames carry chroma detail at full resolution: nv12 subsampling loses it
    assert _top1(arts, "board_sim") < _top1(arts, "compile") - 0.2


def test_featuremap_training_has_no_camera_path(make_ctx):
    ctx = make_ctx(stages={"board_sim": {"runtime_format": "nv12"}})
    with pytest.raises(SpecError, match="featuremap-trained model has no camera input path"):
        run_stages(ctx, *CHAIN[:6])


def test_featuremap_runtime_equals_compile(make_ctx):
    arts = run_stages(make_ctx(), *CHAIN)
    assert _top1(arts, "board_sim") == _top1(arts, "compile")
    assert arts["board_sim"].runtime_format == "featuremap"


def test_a_float_island_and_a_softmax_output_run_on_the_board_and_are_listed(make_ctx):
    """GroupNorm has no integer form (a float island: listed in model_check_result.txt and
    the metrics) and a softmax is the model output: every stage runs, islands on the CPU
    side."""
    data = {"dataset": "tests.models:island_data", "calibration_samples": 32,
            "evaluation_samples": 32, "batch_size": 16}  # fmt: skip
    ctx = make_ctx(model={"factory": "tests.models:islands"}, data=data)
    arts = run_stages(ctx, *CHAIN)
    assert arts["convert"].float_ops == ["gn"]
    metrics = {m.metric: m.value for m in arts["convert"].metrics}
    assert metrics["float_islands"] == 1
    report = ctx.run.path("debug/model_check_result.txt").read_text()
    assert report.rstrip().endswith("on the board's CPU side)\ngn")
    assert _top1(arts, "board_sim") == _top1(arts, "compile") == _top1(arts, "convert")
