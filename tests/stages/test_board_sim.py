"""board_sim: the board's own input path in front of the compiled model."""

import pytest

from schemas.errors import SpecError, StageError
from schemas.spec import parse_spec
from schemas.store import RunStore
from simulator.program import hbm
from simulator.runtime import native
from simulator.runtime.replay import Replays
from stages.board_sim import board_sim
from stages.context import RunContext
from stages.registry import code_version
from stages.registry_types import StageCall
from tests.conftest import tiny_spec_dict
from tests.stages.helpers import H, run_stages

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


@pytest.fixture(scope="module")
def rgb_camera(tmp_path_factory):
    """The RGB-trained model through board_sim behind an rgb camera (board.hbm)."""
    spec = parse_spec(tiny_spec_dict(**RGB, stages={"board_sim": {"runtime_format": "rgb"}}), "t")
    run = RunStore(tmp_path_factory.mktemp("runs")).create_run(
        "tiny", "", "0" * 64, code_version(), {}, {}
    )
    ctx = RunContext(spec=spec, run=run, code_version=code_version())
    return ctx, run_stages(ctx, *CHAIN)


def test_rgb_camera_on_rgb_training_agrees_with_compile(rgb_camera):
    _, arts = rgb_camera
    assert arts["compile"].board_file is not None
    # the folded mean/std rounds the input with an integer multiplier, the featuremap path in
    # float32: near-ties may land one input step apart, nothing more
    assert abs(_top1(arts, "board_sim") - _top1(arts, "compile")) <= 2 / 64


@pytest.mark.skipif(native.library() is None, reason="no replays without the kernels")
def test_board_sim_checks_the_replays_that_give_its_metrics(rgb_camera, monkeypatch):
    """board.hbm has no ONNX twin and its executor was never checked: a replayed
    instruction one value off gave board_sim's metrics. Its replays (and frozen plan,
    where one is built) are now checked against the program's own kernels, on the
    evaluation's batches, before it evaluates."""
    ctx, arts = rgb_camera
    text = ctx.run.path("debug/board_exact.txt").read_text()
    assert "1: kernels (9 of 9 instructions) (32 samples)" in text and "5: " in text
    outputs = set(hbm.load(ctx.run.path(arts["compile"].board_file)).outputs)
    calls = Replays._calls

    def flip(self, i, instr, state, xs):
        ys = calls(self, i, instr, state, xs)
        if ys is not None and outputs & set(instr.outputs):
            ys = [ys[0].clone(), *ys[1:]]
            ys[0].view(-1)[0] += 1
        return ys

    monkeypatch.setattr(Replays, "_calls", flip)
    with pytest.raises(StageError, match="output head differs from its kernels on the .* path, "
                       "the evaluation's batch of 32 samples"):  # fmt: skip
        board_sim(arts["compile"], ctx, StageCall("board_sim", H, H, "test"))


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
