"""prepare, calibrate and qat as plain functions on the tiny model (no Prefect)."""

import pytest
import torch

from schemas.artifacts import CalibratedModel, PreparedModel
from schemas.errors import StageError
from stages.evaluate import collect
from stages.fake_quant import QuantState, quantizers
from stages.modelio import UnsupportedOps, load_qat
from stages.qat import qat
from stages.registry_types import StageCall
from tests.stages.helpers import H, run_stages


def _call(stage):
    return StageCall(stage, H, H, "test")


def _run(ctx, *names):
    return run_stages(ctx, *names)[names[-1]]


def test_prepare_folds_bn_without_changing_the_float_result(make_ctx):
    ctx = make_ctx()
    art = _run(ctx, "prepare")
    assert isinstance(art, PreparedModel)
    m = {x.stage: x.value for x in art.metrics if x.metric == "top1"}
    assert m["float"] == m["prepare"] == 1.0
    check = ctx.run.path("debug/model_check_result.txt").read_text()
    assert "bn: folded into conv" in check and "head: high precision" in check
    graph = ctx.run.path("debug/fx_graph.txt").read_text()
    assert "| conv2 |" in graph and "batch_norm" not in graph


def test_prepare_runs_the_float_state_graph_on_channels_last_batches(make_ctx, monkeypatch):
    """prepare's model (quantizers in FLOAT: a float model) gets the reference's faster
    memory layout (stages.evaluate.channels_last), the same outputs up to float rounding."""
    from stages import evaluate

    seen, run_batch = {}, evaluate.run_batch

    def spy(model, xs, nhwc):
        out, kept = run_batch(model, xs, nhwc)
        seen.setdefault(type(model).__name__, set()).add(kept)
        return out, kept

    monkeypatch.setattr(evaluate, "run_batch", spy)
    art = _run(make_ctx(), "prepare")
    assert {True} in [v for k, v in seen.items() if "Graph" in k]  # the fx graph, nhwc on
    m = {x.stage: x.value for x in art.metrics if x.metric == "top1"}
    assert m["float"] == m["prepare"] == 1.0


def test_calibrate_sets_scales_and_validation_state_prints(make_ctx):
    ctx = make_ctx()
    art = _run(ctx, "prepare", "calibrate")
    assert isinstance(art, CalibratedModel) and art.quant_state == "validation"
    gm = load_qat(art, ctx)
    for _, fq in quantizers(gm):
        assert fq.state is QuantState.VALIDATION and fq.is_frozen
        assert torch.isfinite(fq.scale).all() and (fq.scale > 0).all()
    text = str(gm)
    assert "VALIDATION" in text.upper() and "int8" in text and "scale" in text
    # the saved state reloads to the same model: same top-1 as the stage measured
    out = collect(gm, ctx.evaluation, 32, "calibrate")["output"]
    assert (out.argmax(1) == ctx.evaluation.labels).mean() == art.metrics[0].value
    assert art.metrics[0].value >= 0.9


def test_qat_trains_and_freezes(make_ctx):
    ctx = make_ctx(stages={"qat": {"enabled": True, "steps": 3, "lr": 1e-4}})
    before = _run(ctx, "prepare", "calibrate")
    after = qat(before, ctx, _call("qat"))
    ctx.run.save_artifact(after)
    a, b = load_qat(before, ctx), load_qat(after, ctx)
    assert not torch.equal(a.state_dict()["conv.weight"], b.state_dict()["conv.weight"])
    assert all(fq.state is QuantState.VALIDATION for _, fq in quantizers(b))
    assert after.metrics[0].stage == "qat"


def test_nan_sample_is_refused_by_index(make_ctx):
    ctx = make_ctx(
        data={
            "dataset": "tests.models:nan_data",
            "calibration_samples": 64,
            "evaluation_samples": 64,
            "batch_size": 32,
        }
    )
    with pytest.raises(StageError, match=r"sample 7 of the evaluation split"):
        _run(ctx, "prepare")


def test_unsupported_op_writes_the_report_then_fails(make_ctx):
    ctx = make_ctx(model={"factory": "tests.models:cumsum"})
    source = r"tests/models.py:\d+ \(return super\(\).forward\(torch.cumsum\(x, dim=2\)\)\)"
    with pytest.raises(UnsupportedOps, match=r"cumsum.*node cumsum.*" + source) as e:
        _run(ctx, "prepare")
    assert "model_check_result.txt" in e.value.message
    report = ctx.run.path("debug/model_check_result.txt").read_text()
    assert "## unsupported ops (1)" in report and "aten.cumsum.default" in report
    assert "tests/models.py:" in report.split("## unsupported ops")[1]


def test_untraceable_model_names_the_problem(make_ctx):
    ctx = make_ctx(model={"factory": "tests.models:branchy"})
    with pytest.raises(
        StageError,
        match=r"torch.export cannot trace the model at .*tests/models.py:\d+: .*Fix: remove data-dependent",
    ):
        _run(ctx, "prepare")
