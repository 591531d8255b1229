"""export: qat.onnx agrees with qat.export, keeps every layer id, shows train-only branches."""

import onnx
import pytest
import torch

from schemas.artifacts import QatOnnxModel
from schemas.errors import ArtifactError
from stages.capture import capture
from stages.layers import assign_layer_ids
from stages.modelio import export_graph
from stages.onnx_runner import OnnxRunner
from stages.pre_export import load_qat_export
from tests.stages.helpers import run_stages

AUX = {
    "model": {"factory": "tests.models:aux_branch"},
    "data": {
        "dataset": "tests.models:aux_data",
        "calibration_samples": 64,
        "evaluation_samples": 64,
        "batch_size": 32,
    },
}


def _onnx_ids(path) -> set[str]:
    model = onnx.load(str(path))
    ids = {
        p.value for n in model.graph.node for p in n.metadata_props if p.key == "qparity.layer_id"
    }
    return ids | {n.name.split("/")[0] for n in model.graph.node}


def test_qat_onnx_agrees_with_qat_export_layer_by_layer(make_ctx):
    ctx = make_ctx()
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export", "export")
    exp = load_qat_export(arts["pre_export"], ctx)
    x = torch.from_numpy(ctx.evaluation.x)
    out, layers = capture(exp, x)
    runner = OnnxRunner(ctx.run.path(arts["export"].onnx_file))
    layers = {k: v for k, v in layers.items() if not k.startswith("input:")}  # not a layer
    onnx_out, onnx_layers = runner.run_capture(x.numpy(), list(layers))
    assert abs(onnx_out[0] - out.numpy()).max() <= 1e-5 * abs(out.numpy()).max()
    for lid, t in layers.items():
        assert abs(onnx_layers[lid] - t.numpy()).max() <= 1e-5 * (1 + abs(t.numpy()).max()), lid
    m = {x.stage: x.value for a in arts.values() for x in a.metrics if x.metric == "top1"}
    assert m["export"] == m["pre_export"]


def test_every_layer_id_is_found_in_each_model_or_listed(make_ctx):
    ctx = make_ctx()
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export", "export")
    float_ids = {i.layer_id for i in assign_layer_ids(export_graph(ctx.float_model, ctx.example))}
    import json

    layers = json.loads(ctx.run.path("artifacts/prepare/layers.json").read_text())
    merged = {r["layer_id"] for r in layers if r["merged_into"]}
    qat_ids = {r["layer_id"] for r in layers} - merged
    onnx_ids, unmapped = _onnx_ids(ctx.run.path(arts["export"].onnx_file)), arts["export"].unmapped
    for lid in float_ids:
        assert lid in qat_ids or lid in merged, lid
        assert lid in merged or lid in onnx_ids or lid in unmapped, lid
    assert merged == {"bn"}


def test_train_only_branch_is_exported_without_it_and_shows_in_metrics(make_ctx):
    ctx = make_ctx(**AUX)
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export", "export")
    assert "train-only branch" in arts["export"].unmapped["aux"]
    top1 = {m.stage: m.value for a in arts.values() for m in a.metrics if m.metric == "top1"}
    assert top1["export"] == 1.0  # the deploy branch is what labelled the data
    assert top1["pre_export"] < 0.9  # qat.export still has the aux branch


def test_tampered_qat_onnx_is_refused(make_ctx):
    ctx = make_ctx()
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export", "export")
    path = ctx.run.path(arts["export"].onnx_file)
    path.write_bytes(path.read_bytes().replace(b"sigmoid", b"sigmoix", 1))
    with pytest.raises(ArtifactError, match="qat.onnx.*expected sha256"):
        ctx.run.load_artifact("export", QatOnnxModel)
