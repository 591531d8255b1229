"""pre_export: table ops in fixed point, tables in the artifact, partial application."""

import json

import torch

from stages.capture import capture
from stages.fixed_ops import FixedPointOp
from stages.modelio import load_qat
from stages.pre_export import load_qat_export
from tests.stages.helpers import run_stages

TABLES = {
    "model": {"factory": "tests.models:tables"},
    "data": {
        "dataset": "tests.models:table_data",
        "calibration_samples": 64,
        "evaluation_samples": 64,
        "batch_size": 32,
    },
}


def _models(ctx):
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export")
    return arts, load_qat(arts["calibrate"], ctx), load_qat_export(arts["pre_export"], ctx)


def test_int8_tables_reproduce_qat_exactly(make_ctx):
    ctx = make_ctx()
    arts, qat, exp = _models(ctx)
    assert arts["pre_export"].fixed_point == ["sigmoid"]
    assert any(isinstance(m, FixedPointOp) for m in exp.modules())
    x = torch.from_numpy(ctx.evaluation.x)
    (a, la), (b, lb) = capture(qat, x), capture(exp, x)
    assert torch.equal(a, b)
    assert all(torch.equal(la[k], lb[k]) for k in la)
    m = {x.stage: x.value for x in arts["pre_export"].metrics if x.metric == "top1"}
    assert m["pre_export"] == arts["calibrate"].metrics[0].value


def test_every_table_op_kind_and_int16_segmented(make_ctx):
    ctx = make_ctx(**TABLES, quant={"overrides": {"conv": "int16", "ln": "int16"}})
    arts, qat, exp = _models(ctx)
    fixed = set(arts["pre_export"].fixed_point)
    assert {"sigmoid", "tanh", "exp", "gelu", "silu", "ln", "softmax"} <= fixed
    text = ctx.run.path("debug/lut_tables.txt").read_text()
    assert "segmented" in text and "| sigmoid | int16->int8 |" in text
    x = torch.from_numpy(ctx.evaluation.x)
    a, b = capture(qat, x)[0], capture(exp, x)[0]
    assert not torch.equal(a, b)  # tables approximate the float ops...
    assert (a - b).abs().max() < 0.1 * a.abs().max()  # ...closely
    meta = json.loads(ctx.run.path(arts["pre_export"].tables_file).read_text())
    assert {m["layer_id"] for m in meta} == fixed


def test_partial_pre_export_keeps_other_tables_float(make_ctx):
    ctx = make_ctx(**TABLES, stages={"pre_export": {"subtree": ["ln"]}})
    arts, _, exp = _models(ctx)
    assert arts["pre_export"].fixed_point == ["ln"]
    assert "outside stages.pre_export.subtree" in arts["pre_export"].float_ops["sigmoid"]
    assert sum(isinstance(m, FixedPointOp) for m in exp.modules()) == 1
