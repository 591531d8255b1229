"""The PTQ chain's refusals and its optimizer on a hand-written graph."""

from __future__ import annotations

import json

import onnx
import pytest

from pipelines.ptq import run_ptq
from schemas.errors import StageError
from schemas.store import RunStore
from schemas.tables import read_run_table
from tests.stages.ptq.conftest import helper_model, spec


def _only_run(root):
    (m,) = RunStore(root).list_runs()
    return RunStore(root).open(m.run_id)


def test_unsupported_op_is_reported_by_op_and_node(tmp_path):
    path = tmp_path / "odd.onnx"
    onnx.save(helper_model("Hardmax"), str(path))
    with pytest.raises(StageError, match=r"Hardmax \(node my_hardmax\)"):
        run_ptq(path, spec(), tmp_path / "runs")
    run = _only_run(tmp_path / "runs")
    report = (run.root / "debug/model_check_result.txt").read_text()
    assert "## unsupported ops (1)\nHardmax | node my_hardmax | layer my_hardmax" in report
    assert run.manifest().status == "failed"
    assert read_run_table(run, "stages")[0]["status"] == "failed"


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty"])
def test_not_onnx_or_truncated_file_is_our_error(tmp_path, kind):
    path = tmp_path / "broken.onnx"
    good = helper_model().SerializeToString()
    path.write_bytes({"garbage": b"\x07 this is no onnx \xff" * 9, "truncated": good[: len(good) // 2],
                      "empty": b""}[kind])  # fmt: skip
    with pytest.raises(StageError) as e:
        run_ptq(path, spec(), tmp_path / "runs")
    assert str(path) in e.value.message and "Fix:" in e.value.message


def test_missing_file_is_our_error(tmp_path):
    with pytest.raises(StageError, match="does not exist"):
        run_ptq(tmp_path / "nope.onnx", spec(), tmp_path / "runs")


def test_optimizer_on_a_handwritten_graph(tmp_path):
    path = tmp_path / "hand.onnx"
    onnx.save(helper_model("Sigmoid"), str(path))
    run = RunStore(tmp_path / "runs").open(run_ptq(path, spec(), tmp_path / "runs"))
    removed = json.loads((run.root / "artifacts/optimized.json").read_text())["removed"]
    assert removed == {
        "bn": "BN folded into conv",
        "identity": "redundant Identity removed",
        "dropout": "redundant Dropout removed",
    }
    opt = onnx.load(str(run.root / "artifacts/optimized/hand_optimized_float_model.onnx"))
    assert [n.op_type for n in opt.graph.node] == ["Conv", "Relu", "Flatten", "Gemm", "Sigmoid"]
    gemm = opt.graph.node[3]
    assert {a.name: a.i for a in gemm.attribute} == {"transB": 1}
    metrics = {(m["stage"], m["metric"]): m["value"] for m in read_run_table(run, "metrics")}
    assert metrics[("optimized", "min_layer_cosine")] >= 0.999
    assert metrics[("optimized", "top1")] == metrics[("original", "top1")]
    assert run.manifest().status == "complete"


def test_table_op_off_the_grid_stays_float_and_is_said():
    """A Sigmoid reading the float input (no quantizer before it) is a float island."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from simulator.program.march import MARCHES
    from stages.ptq.ptq import fix_tables

    inits = [numpy_helper.from_array(np.float32(1 / 127), "s"),
             numpy_helper.from_array(np.int8(0), "z")]  # fmt: skip
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["sig/raw"], name="sig"),
        helper.make_node("QuantizeLinear", ["sig/raw", "s", "z"], ["q"], name="sig[output]/q"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["sig"], name="sig[output]/dq"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("sig", TensorProto.FLOAT, [1, 4])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    _, fixed, islands = fix_tables(model, MARCHES["nash-e"])
    assert fixed == [] and "not on a quantization grid" in islands["sig"]
