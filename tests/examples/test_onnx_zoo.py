"""examples/onnx_zoo: graphs in paddle2onnx, ultralytics, tf2onnx and torch TorchScript
idioms through every stage of the PTQ chain, judged by agreement with the original float
model; the optimized stage fuses their LayerNorm, GELU and hardswish idioms."""

from __future__ import annotations

from collections import Counter

import duckdb
import onnx
import pytest

from examples.onnx_zoo import export
from examples.onnx_zoo.graphs import INPUT_SHAPES
from pipelines.ptq import PtqSpec, run_ptq
from schemas.store import RunStore

PTQ = ["original", "optimized", "calibrated", "ptq", "quantized", "hbm", "board"]
FUSED = {
    "bert": {"LayerNormalization": 5, "Gelu": 2},
    "paddle_mobilenet": {"HardSwish": 2},
    "tf_nhwc": {"LayerNormalization": 1},
    "yolo_head": {},
}
"""Ops the optimized stage's pattern fusion makes of each graph's idioms (the graphs run
here; the several-input/output ones, yolo_split, bert_mask and bert_ids, are bench rows: their
contract is tested cheaply by tests/stages/ptq/test_chain_multi_io.py)."""


@pytest.mark.parametrize("name", sorted(FUSED))
def test_an_exporter_idiom_runs_every_ptq_stage(name, tmp_path, monkeypatch):
    monkeypatch.setenv("QPARITY_ALLOWED_ROOTS", str(tmp_path))
    path = export.write(name, tmp_path / f"{name}.onnx")
    spec = PtqSpec.model_validate({
        "model": {"file": str(path), "input_shapes": INPUT_SHAPES.get(name, {})},
        "data": {"dataset": f"examples.onnx_zoo.data:{name}", "calibration_samples": 32,
                 "evaluation_samples": 16, "batch_size": 16},
    })  # fmt: skip
    run = RunStore(tmp_path / "runs").open(run_ptq(path, spec, tmp_path / "runs"))
    assert run.manifest().status == "complete"  # hbm proved bit-exact against quantized
    cosine = dict(duckdb.sql(
        f"SELECT stage, value FROM read_parquet('{run.root}/tables/metrics/**/*.parquet') "
        "WHERE metric = 'cosine'"
    ).fetchall())  # fmt: skip
    assert set(cosine) == set(PTQ) and min(cosine.values()) > 0.99
    ops = Counter(n.op_type for n in onnx.load(run.path(
        f"artifacts/optimized/{name}_optimized_float_model.onnx")).graph.node)  # fmt: skip
    assert {op: ops[op] for op in FUSED[name]} == FUSED[name]
    assert not ops.keys() & {"Erf", "Pow", "Clip"}  # each idiom's inner ops are gone


def test_the_detector_needs_its_input_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("QPARITY_ALLOWED_ROOTS", str(tmp_path))
    path = export.write("yolo_head", tmp_path / "yolo.onnx")
    spec = PtqSpec.model_validate({
        "model": {"file": str(path)},
        "data": {"dataset": "examples.onnx_zoo.data:yolo_head", "calibration_samples": 32,
                 "evaluation_samples": 16, "batch_size": 16},
    })  # fmt: skip
    with pytest.raises(Exception, match=r"x: dim 2 \(H\), dim 3 \(W\)"):
        run_ptq(path, spec, tmp_path / "runs")
