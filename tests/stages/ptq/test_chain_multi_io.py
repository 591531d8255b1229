"""The PTQ chain on a graph with two float inputs and two outputs (#20 item 1, #11's
contract): every stage feeds both inputs by name, every output gets its metrics, the
judged one (compare.output) its top1, hbm and board run both; localize works on it."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

from analysis.ptq_analysis import ptq_models
from pipelines.ptq import PtqCompareSpec, PtqSpec, run_ptq
from qparity import cli
from schemas.errors import StageError
from schemas.store import RunStore
from schemas.tables import read_run_table
from stages.onnx_runner import OnnxRunner
from stages.ptq import feeds
from stages.ptq.chain import STAGES
from tests.stages.ptq import multi_io_models

DATA = "tests.stages.ptq.multi_io_models"


def _spec(path, dataset: str = "data") -> PtqSpec:
    return PtqSpec.model_validate({
        "model": {"file": str(path)},
        "data": {"dataset": f"{DATA}:{dataset}", "calibration_samples": 32,
                 "evaluation_samples": 16, "batch_size": 16, "probe_samples": 2},
        "compare": {"output": "output.shifted"},
    })  # fmt: skip


@pytest.fixture(scope="module")
def two_io_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi_io")
    path = multi_io_models.write(root / "two_io.onnx")
    spec = _spec(path)
    return RunStore(root / "runs").open(run_ptq(path, spec, root / "runs")), spec


def test_both_inputs_and_outputs_run_through_every_stage(two_io_run):
    run, _ = two_io_run
    assert run.manifest().status == "complete"  # hbm bit-exact on both outputs
    rows = read_run_table(run, "metrics")
    cosine = {(r["stage"], r["output"]): r["value"] for r in rows if r["metric"] == "cosine"}
    outputs = ("output.shifted", "output.pooled")
    assert set(cosine) == {(s.name, o) for s in STAGES for o in outputs}
    assert min(cosine.values()) > 0.99
    top1 = {(r["stage"], r["output"]) for r in rows if r["metric"] == "top1"}
    assert top1 == {(s.name, "output.shifted") for s in STAGES}


def test_localize_judges_the_named_output(two_io_run, monkeypatch, capsys):
    run, _ = two_io_run
    monkeypatch.setenv("QPARITY_ALLOWED_ROOTS", str(run.root.parent.parent))
    monkeypatch.setattr(sys, "argv", ["qparity", "localize", run.run_id,
                                      "--runs", str(run.root.parent)])  # fmt: skip
    with pytest.raises(SystemExit) as e:
        cli.main()
        raise SystemExit(0)
    captured = capsys.readouterr()
    assert e.value.code == 0, captured.err + captured.out
    assert "output.shifted" in captured.out.replace("\n", " ")


@pytest.mark.parametrize("output, at", [("output.shifted", 0), ("output.pooled", 1)])
def test_the_analysis_models_compare_the_judged_output(two_io_run, output, at):
    run, spec = two_io_run
    spec = spec.model_copy(update={"compare": PtqCompareSpec(output=output)})
    ev = multi_io_models.data()["evaluation"]["inputs"]
    want = OnnxRunner(multi_io_models.two_io()).run(feeds.take(ev, slice(0, 3)))[at]
    for stage in ("calibrated", "hbm"):
        got, _ = ptq_models(run, spec)[stage].run(np.arange(3))
        np.testing.assert_allclose(got, want, atol=0.1)  # the int8 grid of that output


def test_a_dataset_not_named_like_the_graph_inputs_stops_at_original(tmp_path, monkeypatch):
    monkeypatch.setenv("QPARITY_ALLOWED_ROOTS", str(tmp_path))
    path = multi_io_models.write(tmp_path / "two_io.onnx")
    with pytest.raises(StageError, match=r"inputs \['x', 'm'\] are not the dataset's"):
        run_ptq(path, _spec(path, "renamed_data"), tmp_path / "runs")


def test_int64_token_ids_reach_the_board_through_an_embedding(tmp_path, monkeypatch):
    monkeypatch.setenv("QPARITY_ALLOWED_ROOTS", str(tmp_path))
    path = tmp_path / "embedding.onnx"
    onnx.save(multi_io_models.embedding(), str(path))
    spec = PtqSpec.model_validate({
        "model": {"file": str(path)},
        "data": {"dataset": f"{DATA}:ids_data", "calibration_samples": 32,
                 "evaluation_samples": 16, "batch_size": 16, "probe_samples": 2},
    })  # fmt: skip
    run = RunStore(tmp_path / "runs").open(run_ptq(path, spec, tmp_path / "runs"))
    assert run.manifest().status == "complete"  # hbm bit-exact, fed the int64 ids
    rows = read_run_table(run, "metrics")
    board = [r["value"] for r in rows if r["stage"] == "board" and r["metric"] == "cosine"]
    assert board and board[0] > 0.99
    islands = [r["value"] for r in rows if r["metric"] == "float_islands"]
    assert islands == [0]  # the table quantized like a weight: fc's input is integer


def test_an_int64_input_is_refused_at_original(tmp_path, monkeypatch):
    monkeypatch.setenv("QPARITY_ALLOWED_ROOTS", str(tmp_path))
    path = multi_io_models.write(tmp_path / "two_io.onnx", int_input=True)
    with pytest.raises(StageError, match="input 'm' is int64") as e:
        run_ptq(path, _spec(path), tmp_path / "runs")
    assert "original" in str(e.value) or e.value.where.endswith("input m")
