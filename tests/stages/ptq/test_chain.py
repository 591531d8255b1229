"""The PTQ chain end to end on the exported tiny model: files, tables, bit-exact hbm."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pipelines.ptq import _context, run_ptq
from schemas.errors import StageError
from schemas.store import RunStore
from schemas.tables import read_run_table
from simulator.program import hbm
from simulator.runtime import native
from simulator.runtime.executor import Executor
from stages.onnx_runner import OnnxRunner
from stages.ptq import equivalence
from stages.ptq.chain import STAGES, board_stage, hbm_stage
from stages.ptq.context import PtqModel
from stages.registry_types import StageCall
from tests.models import data
from tests.stages.helpers import H, break_frozen_plan
from tests.stages.ptq import batch_models
from tests.stages.ptq.conftest import spec

VENDOR = [
    "original/tiny_original_float_model.onnx",
    "optimized/tiny_optimized_float_model.onnx",
    "calibrated/tiny_calibrated_model.onnx",
    "ptq/tiny_ptq_model.onnx",
    "quantized/tiny_quantized_model.onnx",
    "hbm/tiny.hbm",
]


@pytest.fixture(scope="module")
def int8_run(tiny_onnx, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    run_id = run_ptq(tiny_onnx, spec(), root)
    return RunStore(root).open(run_id)


def _dtypes(run, stage="calibrated") -> dict[str, str]:
    """Quantizer name -> dtype of its zero point, in the stage's model."""
    model = onnx.load(str(run.root / "artifacts" / stage / f"tiny_{stage}_model.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {
        n.name.removesuffix("/q"): str(inits[n.input[2]].dtype)
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.name.endswith("/q") and "[" in n.name
    }


def test_every_stage_writes_its_vendor_file_and_top1(int8_run):
    assert int8_run.manifest().status == "complete"
    for rel in VENDOR:
        assert (int8_run.root / "artifacts" / rel).is_file(), rel
    metrics = read_run_table(int8_run, "metrics")
    top1 = {m["stage"]: m["value"] for m in metrics if m["metric"] == "top1"}
    assert set(top1) == {s.name for s in STAGES}
    assert top1["optimized"] == top1["original"]
    stages = {r["stage"]: r["status"] for r in read_run_table(int8_run, "stages")}
    assert stages == {s.name: "complete" for s in STAGES}
    assert read_run_table(int8_run, "runs")[0]["status"] == "complete"


def test_optimized_is_equivalent_and_bn_is_fused(int8_run):
    art = lambda s: onnx.load(str(int8_run.root / "artifacts" / s / f"tiny_{s}_float_model.onnx"))  # noqa: E731
    original, optimized = art("original"), art("optimized")
    assert "BatchNormalization" not in {n.op_type for n in optimized.graph.node}
    removed = json.loads((int8_run.root / "artifacts/optimized.json").read_text())["removed"]
    assert removed["bn"] == "BN folded into conv"
    x = data()["evaluation"][0][:8]
    rows = equivalence.compare_layers(original, optimized, x, removed)
    cosines = [c for _, _, c, _ in rows if c is not None]
    assert len(cosines) >= 8 and min(cosines) >= 0.999


def test_quantized_and_hbm_agree_bit_for_bit(int8_run):
    x = data()["evaluation"][0][:4]
    quantized = OnnxRunner(int8_run.root / "artifacts" / VENDOR[4])
    layers = json.loads((int8_run.root / "artifacts/quantized/layers.json").read_text())
    ref_out, ref = quantized.run_capture(x, [v["tensor"] for v in layers.values()])
    out, got = Executor(hbm.load(int8_run.root / "artifacts" / VENDOR[5])).run({"x": x}, True)
    assert np.array_equal(next(iter(out.values())), ref_out[0])
    assert len(got) >= 5
    for lid, ints in got.items():
        assert np.array_equal(ints, ref[layers[lid]["tensor"]]), lid


@pytest.mark.skipif(native.library() is None, reason="no frozen plan without the kernels")
def test_hbm_checks_the_frozen_plan_like_compile(int8_run, tiny_onnx, monkeypatch):
    """hbm runs compile's check (stages.exactness): the frozen plan that gives hbm's and
    board's top-1 is compared too, and one value off in its output stops the stage."""
    text = (int8_run.root / "debug/bit_exact.txt").read_text()
    assert "5: frozen plan" in text and "outputs compared on every run: head" in text
    ctx = _context(int8_run, "tiny", tiny_onnx, spec())
    up = int8_run.load_artifact("quantized", PtqModel)
    break_frozen_plan(monkeypatch)
    with pytest.raises(StageError, match="output head differs .* on the frozen plan path"):
        hbm_stage(up, ctx, StageCall("hbm", H, H, "test"))


@pytest.mark.skipif(native.library() is None, reason="no frozen plan without the kernels")
def test_hbm_and_board_check_the_executors_of_their_metrics(int8_run, tiny_onnx, monkeypatch):
    """The frozen plan of the evaluation's 32-sample batches is not the probe batch's: one
    wrong only there gave hbm's and board's top-1 unseen. Both stages now check the
    executor they evaluate with, on those batches, before evaluating."""
    text = (int8_run.root / "debug/bit_exact.txt").read_text()
    assert "5: frozen plan (32 samples)" in text
    assert "5: frozen plan (32 samples)" in (int8_run.root / "debug/board_exact.txt").read_text()
    ctx = _context(int8_run, "tiny", tiny_onnx, spec())
    up = int8_run.load_artifact("quantized", PtqModel)
    break_frozen_plan(monkeypatch, rows=32)
    with pytest.raises(StageError, match="output head differs from quantized.onnx on the "
                       "frozen plan path, the evaluation's batch of 32 samples"):  # fmt: skip
        hbm_stage(up, ctx, StageCall("hbm", H, H, "test"))
    hbm_art = int8_run.load_artifact("hbm", PtqModel)
    with pytest.raises(StageError, match="differs from its kernels on the frozen plan path"):
        board_stage(hbm_art, ctx, StageCall("board", H, H, "test"))


def test_sigmoid_becomes_a_lookup_table(int8_run):
    ptq = onnx.load(str(int8_run.root / "artifacts" / VENDOR[3]))
    assert [n.name for n in ptq.graph.node if n.op_type == "Lut"] == ["Sigmoid"]
    assert "Sigmoid" not in {n.op_type for n in ptq.graph.node}
    report = (int8_run.root / "debug/model_check_result.txt").read_text()
    assert "table ops left in float (float islands) (0)" in report


def test_int8_default_dtypes(int8_run):
    got = _dtypes(int8_run)
    assert got["input:x[input]"] == "int8" and got["conv[weight]"] == "int8"
    assert {v for k, v in got.items() if k.endswith("[output]")} == {"int8"}


def test_int16_and_per_node_overrides(tiny_onnx, tmp_path):
    run_id = run_ptq(tiny_onnx, spec(activation_dtype="int16"), tmp_path, stop_after="calibrated")
    got = _dtypes(RunStore(tmp_path).open(run_id))
    assert {v for k, v in got.items() if not k.endswith("[weight]")} == {"int16"}
    assert {v for k, v in got.items() if k.endswith("[weight]")} == {"int8"}
    overrides = {"/conv/Conv": "int16", "Mul": "int16"}  # a node name and a layer id
    run_id = run_ptq(tiny_onnx, spec(overrides=overrides), tmp_path, stop_after="calibrated")
    got = _dtypes(RunStore(tmp_path).open(run_id))
    assert got["conv[output]"] == got["Mul[output]"] == "int16"
    assert got["Sigmoid[output]"] == got["input:x[input]"] == "int8"


def test_a_dataset_without_labels_is_judged_by_agreement_with_the_original(tiny_onnx, tmp_path):
    s = spec()
    s = s.model_copy(update={"data": s.data.model_copy(
        update={"dataset": "tests.models:unlabelled_data"})})  # fmt: skip
    run = RunStore(tmp_path).open(run_ptq(tiny_onnx, s, tmp_path))
    rows = read_run_table(run, "metrics")
    cosine = {m["stage"]: m["value"] for m in rows if m["metric"] == "cosine"}
    assert set(cosine) == {st.name for st in STAGES} and not [
        m for m in rows if m["metric"] == "top1"
    ]
    assert cosine["original"] == 1.0 and cosine["board"] > 0.99
    assert cosine["board"] == cosine["quantized"]  # hbm and board are bit-exact


def test_a_file_with_its_batch_fixed_at_1_runs_every_stage_hbm_bit_exact(tmp_path):
    """A ViT in small exported at batch 1 (tests/stages/ptq/batch_models.py): original
    makes the batch dynamic and proves it against the file frame by frame."""
    path = tmp_path / "vit1.onnx"
    onnx.save(batch_models.class_token(1), path)
    run = RunStore(tmp_path / "runs").open(run_ptq(path, spec(), tmp_path / "runs"))
    assert run.manifest().status == "complete"
    check = run.path("debug/model_check_result.txt").read_text()
    assert "batch: fixed at 1, made dynamic (2 rewrites)" in check
    assert "the rewritten model equals the file on 4 frames" in check
    assert "\nseq\n" not in check  # the class token's Concat is integer, not an island
    assert (
        run.path("debug/bit_exact.txt")
        .read_text()
        .startswith("# program vs quantized.onnx on 4 probe samples: all equal")
    )
