"""The PTQ example: the digits CNN's float ONNX through the whole PTQ chain."""

from __future__ import annotations

from pathlib import Path

from pipelines.ptq import load_ptq_spec, model_path, run_ptq
from schemas.store import RunStore
from schemas.tables import read_run_table

SPEC = Path(__file__).resolve().parents[2] / "examples" / "digits_ptq" / "spec.yaml"


def test_every_ptq_stage_keeps_the_float_top1(tmp_path):
    spec, text = load_ptq_spec(SPEC)
    run_id = run_ptq(model_path(spec), spec, tmp_path, text)
    run = RunStore(tmp_path).open(run_id)
    top1 = {r["stage"]: r["value"] for r in read_run_table(run, "metrics") if r["metric"] == "top1"}
    assert list(top1) and set(top1) >= {"original", "optimized", "quantized", "hbm", "board"}
    assert min(top1.values()) >= top1["original"] - 0.01
    assert run.manifest().status == "complete"
    assert (run.path("artifacts/hbm") / "digits_cnn.hbm").exists()
