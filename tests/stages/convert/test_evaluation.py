"""convert's metrics over the whole split: the compiled kernels once proven, else the
reference evaluator; either way the metrics are the reference evaluator's."""

import numpy as np
import pytest

from simulator.runtime import native
from stages.convert.stage import run_integer
from stages.evaluate import measure
from tests.stages.helpers import break_frozen_plan, break_kernels, run_stages

CHAIN = ("prepare", "calibrate", "pre_export", "export", "convert")


def _reference_metrics(ctx, art) -> dict:
    """convert's metrics computed the slow, obvious way: the reference evaluator on every
    sample at once."""
    outputs, _ = run_integer(ctx.run.root, art, ctx.evaluation.x)
    got = dict(zip(ctx.reference, (np.asarray(o) for o in outputs), strict=True))
    rows = measure("convert", got, ctx.reference, ctx.evaluation.labels, None)
    return {(m.metric, m.output): m.value for m in rows}


def _metrics(art) -> dict:
    return {(m.metric, m.output): m.value for m in art.metrics if m.output is not None}


def test_the_kernels_give_the_metrics_once_proven_on_the_evaluation_batches(make_ctx):
    ctx = make_ctx()  # 64 evaluation samples in batches of 32: the proof is batch 0
    art = run_stages(ctx, *CHAIN)["convert"]
    how = ctx.run.path("debug/convert_evaluation.txt").read_text()
    assert how.startswith("the compiled kernels"), how
    assert "1: kernels" in how and "(32 samples)" in how
    # the frozen plan, built from replays of the C kernels, runs the later batches
    assert ("frozen plan" in how) == (native.library() is not None), how
    assert _metrics(art) == _reference_metrics(ctx, art)


NO_PLAN = pytest.mark.skipif(
    native.library() is None, reason="the frozen plan is built only with the compiled kernels"
)


@pytest.mark.parametrize("path", ["kernels", pytest.param("frozen plan", marks=NO_PLAN)])
def test_kernels_that_differ_from_the_reference_are_not_used(make_ctx, monkeypatch, path):
    """One value off on a path the evaluation runs (the first batch's kernels everywhere,
    the later batches' frozen plan with the compiled kernels): the reference evaluator
    gives the metrics, and the text names the path that differed."""
    (break_frozen_plan if path == "frozen plan" else break_kernels)(monkeypatch)
    ctx = make_ctx()
    art = run_stages(ctx, *CHAIN)["convert"]
    how = ctx.run.path("debug/convert_evaluation.txt").read_text()
    assert how.startswith("the reference evaluator"), how
    assert f"on the {path}" in how and "not used" in how  # the difference is named
    assert _metrics(art) == _reference_metrics(ctx, art)


def test_one_batch_runs_on_the_reference(make_ctx):
    ctx = make_ctx(data={**make_ctx().spec.data.model_dump(), "batch_size": 64})
    art = run_stages(ctx, *CHAIN)["convert"]
    how = ctx.run.path("debug/convert_evaluation.txt").read_text()
    assert how.startswith("the reference evaluator") and "one batch" in how
    assert _metrics(art) == _reference_metrics(ctx, art)
