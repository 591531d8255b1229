"""qparity edit (bc_editor): node numbers, fake-quant removal, fallbacks ranked."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from analysis import edit_run as edit_run_module
from analysis.edit import agreement, pairs_of, parse_numbers, remove_fake_quant, why_kept
from analysis.edit_run import SAMPLES, edit_run
from pipelines.flow import run_chain
from qparity import cli
from schemas.errors import SpecError, StageError
from schemas.spec import load_spec, parse_spec
from stages.context import RunContext
from stages.onnx_runner import OnnxRunner
from tests.conftest import tiny_spec_dict


def test_numbers_and_ranges():
    assert parse_numbers("1-3, 7,2", 10) == [1, 2, 3, 7]
    with pytest.raises(SpecError, match="outside the graph's nodes 0-9"):
        parse_numbers("5-12", 10)
    with pytest.raises(SpecError, match="'x' is not a number"):
        parse_numbers("x", 10)


def test_no_numbers_at_all_are_refused_as_such():
    """Was: every number "kept" and an empty "nothing to remove: " message."""
    with pytest.raises(SpecError, match="no node number in ' , '"):
        parse_numbers(" , ", 10)


def _linear_3d() -> onnx.ModelProto:
    """Export's linear on a 3-D input: DQ(Q(W)) -> Transpose -> MatMul -> Add(bias) -> Q/DQ."""
    h, f32 = onnx.helper, onnx.TensorProto.FLOAT
    consts = {"w": np.ones((8, 16), np.float32), "b": np.zeros(8, np.float32)}
    consts |= {"s": np.float32(0.1), "z": np.int8(0)}
    nodes = [
        h.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"], name="fc[weight]/q"),
        h.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"], name="fc[weight]/dq"),
        h.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0], name="fc"),
        h.make_node("MatMul", ["x", "wt"], ["mm"], name="fc/1"),
        h.make_node("Add", ["mm", "b"], ["fc"], name="fc/2"),
        h.make_node("QuantizeLinear", ["fc", "s", "z"], ["fq"], name="fc[output]/q"),
        h.make_node("DequantizeLinear", ["fq", "s", "z"], ["y"], name="fc[output]/dq"),
    ]
    graph = h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", f32, [2, 4, 16])],
        [h.make_tensor_value_info("y", f32, None)],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
    )  # fmt: skip
    return h.make_model(graph)


def test_a_linear_on_a_3d_input_stands_for_its_transposed_weight_and_biased_output():
    model = _linear_3d()
    assert pairs_of(model, 3) == [(0, 1), (5, 6)]  # the MatMul
    assert pairs_of(model, 4) == [(5, 6)] and pairs_of(model, 2) == []  # bias Add, Transpose
    assert "number node 1 to run it on floats" in why_kept(model, 2)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(stages={"stop_after": "convert"}, compare={"enabled": False})
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    model = onnx.load(str(root / result.run_id / "artifacts/export/qat.onnx"))
    return root, result.run_id, model


def test_removing_every_pair_leaves_only_the_table_ops_integer_io(run):
    _, _, model = run
    everything = list(range(len(model.graph.node)))
    edited, removed = remove_fake_quant(model, everything)
    users = {i: n for n in edited.graph.node for i in n.input}
    makers = {o: n for n in edited.graph.node for o in n.output}
    left = [n for n in edited.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert removed and left  # the sigmoid table takes and gives integers
    for n in left:
        near = users.get(n.output[0]) if n.op_type == "QuantizeLinear" else makers[n.input[0]]
        assert near.domain == "qparity", n.name
    x = np.random.default_rng(0).uniform(-1, 1, (4, 1, 8, 8)).astype(np.float32)
    assert OnnxRunner(edited).run(x)[0].shape == OnnxRunner(model).run(x)[0].shape


def test_a_compute_node_stands_for_its_weight_and_output_pairs(run):
    _, _, model = run
    conv = next(i for i, n in enumerate(model.graph.node) if n.op_type == "Conv")
    kinds = sorted(model.graph.node[q].name.split("[")[-1] for q, _ in pairs_of(model, conv))
    assert kinds == ["output]/q", "weight]/q"]


def test_fallbacks_are_ranked_by_consistency_gain(run):
    root, run_id, model = run
    convs = [str(i) for i, n in enumerate(model.graph.node) if n.op_type == "Conv"]
    result = edit_run(root, run_id, ",".join(convs))
    base, fallbacks = result.base, result.fallbacks
    gains = [f.gain for f in fallbacks]
    assert gains == sorted(gains, reverse=True) and len(fallbacks) == len(convs) + 1
    assert all(f.l1 >= 0 and np.isclose(f.gain, base["l1"] - f.l1) for f in fallbacks)


def test_an_output_whose_consumer_falls_to_float_next_to_a_table_op_converts(run):
    """Removing add's or mul's output fake quant leaves mul a float island fed by the
    sigmoid table: the table's integers must keep their declared type (was: "Type
    mismatch 7 != 3 in DequantizeLinear", blamed on the model)."""
    root, run_id, model = run
    names = {n.name: i for i, n in enumerate(model.graph.node)}
    numbers = f"{names['add']},{names['mul']}"
    fallbacks = edit_run(root, run_id, numbers).fallbacks
    assert len(fallbacks) == 3 and all(f.removed and np.isfinite(f.l1) for f in fallbacks)


def test_the_edit_is_written_into_the_run_and_runs(run):
    root, run_id, model = run
    names = {n.name: i for i, n in enumerate(model.graph.node)}
    result = edit_run(root, run_id, f"{names['conv']},{names['relu']}")
    assert result.written == f"artifacts/edit/{names['conv']}_{names['relu']}/qat_modified.onnx"
    path = root / run_id / result.written
    onnx.checker.check_model(onnx.load(str(path)))
    expected, _ = remove_fake_quant(model, [names["conv"]])
    x = np.random.default_rng(0).uniform(-1, 1, (4, 1, 8, 8)).astype(np.float32)
    assert np.array_equal(OnnxRunner(path).run(x)[0], OnnxRunner(expected).run(x)[0])
    assert result.kept == [why_kept(model, names["relu"])]
    assert f"number node {names['conv[output]/dq']}" in result.kept[0]


def test_numbers_with_nothing_to_remove_are_refused_naming_each(run):
    root, run_id, model = run
    lut = next(i for i, n in enumerate(model.graph.node) if n.op_type == "Lut")
    with pytest.raises(
        SpecError, match=rf"nothing to remove: node {lut} \(Lut sigmoid\) is a table"
    ):
        edit_run(root, run_id, str(lut))


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """A run whose convert dropped conv's bias (spec ``faults:``)."""
    root = tmp_path_factory.mktemp("faulty")
    data = tiny_spec_dict(
        stages={"stop_after": "convert"},
        compare={"enabled": False},
        faults=[{"kind": "bias_drop", "layer": "conv"}],
    )
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return root, result.run_id


def test_the_comparison_is_against_the_run_model_faults_included(faulty):
    root, run_id = faulty
    run_dir = root / run_id
    qat = onnx.load(str(run_dir / "artifacts/export/qat.onnx"))
    conv = next(i for i, n in enumerate(qat.graph.node) if n.name == "conv")
    result = edit_run(root, run_id, str(conv))
    x = RunContext(spec=load_spec(run_dir / "spec.yaml"), run=None, code_version="")
    x = x.evaluation.x[:SAMPLES]
    as_run = OnnxRunner(run_dir / "artifacts/convert/quantized.onnx").run(x)[0]
    expected = agreement(OnnxRunner(qat).run(x)[0], as_run)
    assert result.base["l1"] == expected["l1"] and result.faults == 1
    (fallback,) = result.fallbacks  # conv in float: the dropped bias is gone with its integers
    assert fallback.faults_skipped == ["bias_drop on conv"]
    assert fallback.gain > 0.5 * result.base["l1"]


def test_the_command_prints_the_written_path_and_the_kept_nodes(run, monkeypatch, capsys):
    root, run_id, model = run
    relu = next(i for i, n in enumerate(model.graph.node) if n.op_type == "Relu")
    conv = relu - 3  # conv, its output Q/DQ, relu
    args = ["edit", run_id, "--remove-fake-quant", f"{conv},{relu}", "--runs", str(root)]
    monkeypatch.setattr(sys, "argv", ["qparity", *args])
    cli.main()
    printed = capsys.readouterr().out
    assert f"edited qat.onnx written: {root}/{run_id}/artifacts/edit/{conv}_{relu}/" in printed
    assert f"kept: node {relu} (Relu relu) has no fake quant of its own" in printed


def test_an_edit_that_breaks_the_graph_is_refused_naming_the_nodes(run, monkeypatch):
    root, run_id, model = run

    class BreaksOnEdits(edit_run_module.Converter):
        def run(self):
            if len(self.src.graph.node) < len(model.graph.node):
                raise StageError("the graph failed to run", where="qparity_quantized")
            return super().run()

    monkeypatch.setattr(edit_run_module, "Converter", BreaksOnEdits)
    with pytest.raises(StageError, match=r"node\(s\) 9 of qat.onnx removed.*leave node\(s\) 9"):
        edit_run(root, run_id, "9")


SHAPES = {
    # a PReLU's slope reshaped by a constant-only node (folded by convert), two heads
    # with the judged one (class scores) second
    "two heads": {"model": {"factory": "tests.models:two_heads"},
                  "data": {**tiny_spec_dict()["data"], "dataset": "tests.models:two_head_data"},
                  "compare": {"enabled": False, "output": "output.1"}},
    # two int64 inputs, token ids and an attention mask
    "two inputs": {"model": {"factory": "tests.models:masked_mean"},
                   "data": {**tiny_spec_dict()["data"], "dataset": "tests.models:tokens_data"},
                   "compare": {"enabled": False}},
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shaped(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("shaped")
    data = tiny_spec_dict(stages={"stop_after": "convert"}, **SHAPES[request.param])
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return root, result.run_id


def test_the_unedited_graph_is_the_run_integer_graph_on_every_input_and_judged_output(shaped):
    """Was: only the first input fed (a two-input model failed to run, blamed on the
    model), the first output compared, and constant-only nodes left unfolded (a PReLU a
    float island the run's convert never made)."""
    root, run_id = shaped
    run_dir = root / run_id
    ctx = RunContext(spec=load_spec(run_dir / "spec.yaml"), run=None, code_version="")
    x, at = ctx.evaluation.arrays(0, SAMPLES), 1 if ctx.spec.compare.output else 0
    qat = OnnxRunner(run_dir / "artifacts/export/qat.onnx").run(x)[at]
    as_run = OnnxRunner(run_dir / "artifacts/convert/quantized.onnx").run(x)[at]
    result = edit_run(root, run_id, "1")
    assert result.base["l1"] == agreement(qat, as_run)["l1"] > 0


def test_a_ptq_run_is_refused_as_one(run, tmp_path):
    """Was: "pipeline: unknown named pipeline 'ptq_chain'", blaming the PTQ spec."""
    root, run_id, _ = run
    shutil.copytree(root / run_id, tmp_path / run_id)
    (tmp_path / run_id / "spec.yaml").write_text(Path("examples/digits_ptq/spec.yaml").read_text())
    manifest = json.loads((tmp_path / run_id / "manifest.json").read_text())
    manifest["stages"]["calibrated"] = {**manifest["stages"]["calibrate"], "stage": "calibrated"}
    (tmp_path / run_id / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecError, match=f"run {run_id} is a PTQ chain run: it has no qat.onnx"):
        edit_run(tmp_path, run_id, "1")
