"""convert's metrics over the whole split: the compiled kernels once proven, else the
reference evaluator; either way the metrics are the reference evaluator's."""

import numpy as np

from stages.convert.stage import run_integer
from stages.evaluate import measure
from tests.stages.helpers import break_frozen_plan, run_stages

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
    assert "frozen plan" in how and "(32 samples)" in how
    assert _metrics(art) == _reference_metrics(ctx, art)


def test_kernels_that_differ_from_the_reference_are_not_used(make_ctx, monkeypatch):
    break_frozen_plan(monkeypatch)  # the path the evaluation would run is one off
    ctx = make_ctx()
    art = run_stages(ctx, *CHAIN)["convert"]
    how = ctx.run.path("debug/convert_evaluation.txt").read_text()
    assert how.startswith("the reference evaluator"), how
    assert "frozen plan" in how and "not used" in how  # the difference is named
    assert _metrics(art) == _reference_metrics(ctx, art)


def test_one_batch_runs_on_the_reference(make_ctx):
    ctx = make_ctx(data={**make_ctx().spec.data.model_dump(), "batch_size": 64})
    art = run_stages(ctx, *CHAIN)["convert"]
    how = ctx.run.path("debug/convert_evaluation.txt").read_text()
    assert how.startswith("the reference evaluator") and "one batch" in how
    assert _metrics(art) == _reference_metrics(ctx, art)
