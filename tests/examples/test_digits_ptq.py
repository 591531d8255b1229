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


def test_a_ptq_run_is_localized_from_its_float_model_on(tmp_path):
    """optimized -> calibrated, the quantization loss, is compared like every other pair;
    the clean run diverges nowhere."""
    from analysis.ptq_analysis import analyze_ptq, is_ptq_run

    spec, text = load_ptq_spec(SPEC)
    run = RunStore(tmp_path).open(run_ptq(model_path(spec), spec, tmp_path, text))
    assert is_ptq_run(run)
    analysis = analyze_ptq(run, spec)
    assert analysis.chain == ["optimized", "calibrated", "ptq", "quantized", "hbm", "board"]
    assert analysis.first is None, analysis.summary()
    stages = [r for r in read_run_table(run, "localization") if r["kind"] == "stage"]
    assert [(r["base_stage"], r["stage"]) for r in stages] == [
        ("optimized", "calibrated"), ("calibrated", "ptq"), ("ptq", "quantized"),
        ("quantized", "hbm"), ("hbm", "board"),
    ]  # fmt: skip
    assert [r["value"] for r in stages][3:] == [0.0, 0.0]  # hbm and board are bit-exact


def test_a_second_ptq_run_takes_every_stage_from_the_cache(tmp_path):
    spec, text = load_ptq_spec(SPEC)
    first = run_ptq(model_path(spec), spec, tmp_path, text)
    second = RunStore(tmp_path).open(run_ptq(model_path(spec), spec, tmp_path, text))
    stages = second.manifest().stages
    assert all(rec.cache_hit and rec.cache_source_run == first for rec in stages.values())
    assert second.manifest().status == "complete"
