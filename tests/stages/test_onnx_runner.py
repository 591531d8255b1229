"""OnnxRunner: backend choice, outputs, capture by layer id, bad files."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from schemas.errors import StageError
from stages.onnx_runner import OnnxRunner


def _model(domain: str = "") -> onnx.ModelProto:
    """x -> Relu ("relu") -> Mul by 2 ("mul"); optionally a qparity::QuantizeLinear."""
    nodes = [
        helper.make_node("Relu", ["x"], ["relu"], "relu"),
        helper.make_node("Mul", ["relu", "two"], ["mul"], "mul"),
    ]
    out = "mul"
    if domain:
        nodes += [
            helper.make_node(
                "QuantizeLinear",
                ["mul", "s"],
                ["q"],
                "q",
                domain=domain,
                axis=1,
                dtype="int8",
                rounding="bpu_round",
            ),  # fmt: skip
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["dq"], "dq"),
        ]
        out = "dq"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", 3])],
        [
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
            helper.make_tensor("zp", TensorProto.INT8, [], [0]),
        ],
        value_info=[helper.make_tensor_value_info("q", TensorProto.INT8, None)],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("qparity", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


X = np.array([[-1.0, 0.25, 0.75], [1.25, 2.0, -3.0]], np.float32)


def test_onnxruntime_backend_runs_and_captures_by_name(tmp_path):
    onnx.save(_model(), str(tmp_path / "m.onnx"))
    runner = OnnxRunner(tmp_path / "m.onnx")
    assert runner.backend == "onnxruntime"
    (out,) = runner.run(X)
    np.testing.assert_array_equal(out, np.maximum(X, 0) * 2)
    outs, layers = runner.run_capture(X, ["relu", "mul"])
    np.testing.assert_array_equal(layers["relu"], np.maximum(X, 0))
    np.testing.assert_array_equal(layers["mul"], outs[0])


def test_custom_domain_uses_the_reference_backend_with_bpu_rounding():
    runner = OnnxRunner(_model("qparity"))
    assert runner.backend == "reference"
    outs, layers = runner.run_capture(X, ["relu"])
    # 2 * relu(x) / 0.5 = 4 * relu(x): 0.25 -> 1.0 exactly, 0.75 -> 3.0; ties need x/s=.5
    np.testing.assert_array_equal(outs[0], np.clip(np.maximum(X, 0) * 2, -64, 63.5))
    np.testing.assert_array_equal(layers["relu"], np.maximum(X, 0))
    ties = np.array([[0.125, 0.375, -0.125]], np.float32)  # relu -> 2x -> /0.5: 0.5, 1.5, 0
    np.testing.assert_array_equal(runner.run(ties)[0], [[0.5, 1.0, 0.0]])  # half away


def test_unknown_capture_id_is_an_error():
    with pytest.raises(StageError, match=r"no tensor named \['nope'\]"):
        OnnxRunner(_model()).run_capture(X, ["nope"])


def test_truncated_and_non_onnx_files_name_the_file(tmp_path):
    data = _model().SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    junk = tmp_path / "junk.onnx"
    junk.write_text("this is not a protobuf\n" * 10)
    for path in (cut, junk, tmp_path / "missing.onnx"):
        with pytest.raises(StageError, match=str(path.name)):
            OnnxRunner(path)


def test_export_then_run_a_saved_model_with_a_dynamic_batch(tmp_path):
    from stages.modelio import export_graph
    from stages.onnx_export import export_onnx
    from tests.models import tiny

    x = torch.randn(7, 1, 8, 8)
    gm = export_graph(tiny(), x[:2])
    export_onnx(gm, x[:2], tmp_path / "tiny.onnx")
    runner = OnnxRunner(tmp_path / "tiny.onnx")
    with torch.no_grad():
        ref = gm(x).numpy()
    np.testing.assert_allclose(runner.run(x.numpy())[0], ref, atol=1e-5)


def test_non_finite_inputs_quantize_as_the_board_does():
    """A float island's ``x / 0`` (inf) and ``0 / 0`` (NaN): onnx's own QuantizeLinear casts
    ``rint(inf)`` to INT_MIN (-128 after the clip); the runner's saturates like the board's
    QUANTIZE and :func:`fixedpoint.quantize`: +inf -> 127, -inf and NaN -> -128."""
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from simulator.arith import fixedpoint
    from stages.onnx_runner import custom_op_classes

    graph = helper.make_graph(
        [helper.make_node("Div", ["a", "b"], ["d"]),
         helper.make_node("QuantizeLinear", ["d", "s", "z"], ["q"])],
        "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "ab"],
        [helper.make_tensor_value_info("q", TensorProto.INT8, [4])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
         helper.make_tensor("z", TensorProto.INT8, [], [0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    a, b = np.array([1.0, -1.0, 0.0, 2.0], np.float32), np.array([0, 0, 0, 1], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        plain = ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0]
        ours = ReferenceEvaluator(model, new_ops=custom_op_classes()).run(None, {"a": a, "b": b})[0]
        board = fixedpoint.quantize(a / b, np.float32(0.1), "int8", "half_even")
    assert plain.tolist()[0] == -128  # the quirk the override removes
    assert ours.tolist() == board.tolist() == [127, -128, -128, 20]
    assert onnx.checker.check_model(model) is None


def test_reference_backend_keeps_only_outputs_and_captured_tensors():
    """The reference run drops intermediates (stages.onnx_ref_ops.run_kept) and its Conv is
    the bounded one: onnx's own holds every tensor and builds dense dilated kernels."""
    from stages.onnx_ref_ops import Conv

    runner = OnnxRunner(_model("qparity"))
    named = runner._named({"x": X}, ["relu"])
    assert set(named) == {"dq", "relu"}
    np.testing.assert_array_equal(named["relu"], np.maximum(X, 0))
    assert runner._reference().new_ops_[("", "Conv")] is Conv


def test_inputs_fed_by_name_in_any_order():
    from tests.stages.ptq.multi_io_models import inputs, two_io

    xs, runner = inputs(4, 0), OnnxRunner(two_io())
    by_name = runner.run(xs)  # m listed before x: the names place them
    np.testing.assert_array_equal(by_name[0], runner.run((xs["x"], xs["m"]))[0])


def test_cut_runners_are_kept_for_the_last_few_sets_of_names_only(monkeypatch):
    """Sensitivity cuts one graph per candidate: each cut runner holds a session."""
    monkeypatch.setattr("stages.onnx_runner.CUT_RUNNERS", 2)
    runner = OnnxRunner(_model())
    first = runner.with_inputs(("relu",))
    assert runner.with_inputs(("relu",)) is first  # cached
    runner.with_inputs(("mul",))
    runner.with_inputs(("relu", "mul"))
    cuts = [k for k in runner._sessions if k[0] == "cut"]
    assert cuts == [("cut", "mul"), ("cut", "mul", "relu")]
    again = runner.with_inputs(("relu",))  # rebuilt, and still right
    assert again is not first
    outs, got = again.run_capture(X, [], {"relu": np.ones_like(X)})
    np.testing.assert_array_equal(outs[0], np.full_like(X, 2.0))


def test_the_reference_runs_a_big_batch_in_chunks_with_the_same_result(monkeypatch):
    """REF_CHUNK samples at a time, joined along the batch; a kept tensor without the batch
    axis (here the constant "two", as a reshaped parameter would be) is taken once."""
    from stages import onnx_runner

    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 3)).astype(np.float32)
    whole, whole_layers = OnnxRunner(_model("qparity")).run_capture(x, ["relu", "mul"])
    calls = []
    run_kept = onnx_runner.run_kept
    monkeypatch.setattr(
        onnx_runner, "run_kept", lambda e, f, k: calls.append(1) or run_kept(e, f, k)
    )
    monkeypatch.setattr(onnx_runner, "REF_CHUNK", 4)
    model = _model("qparity")
    model.graph.output.append(helper.make_tensor_value_info("two", TensorProto.FLOAT, []))
    outs, layers = OnnxRunner(model).run_capture(x, ["relu", "mul"])
    assert len(calls) == 3  # 4 + 4 + 3 samples
    np.testing.assert_array_equal(outs[0], whole[0])
    assert float(outs[1]) == 2.0
    for name in ("relu", "mul"):
        np.testing.assert_array_equal(layers[name], whole_layers[name])


def test_forget_cuts_drops_every_cut_runner_and_the_next_cut_is_built_again():
    """judge_pair forgets both models' cuts once a pair is judged: each cut holds a copy of
    the weights (stages.onnx_runner.CUT_RUNNERS)."""
    runner = OnnxRunner(_model())
    first = runner.with_inputs(("relu",))
    runner.forget_cuts()
    assert not [k for k in runner._sessions if k[0] == "cut"]
    again = runner.with_inputs(("relu",))
    assert again is not first
    outs, _ = again.run_capture(X, [], {"relu": np.ones_like(X)})
    np.testing.assert_array_equal(outs[0], np.full_like(X, 2.0))
    np.testing.assert_array_equal(
        runner.run(X)[0], first.run_capture(X, [], {"relu": np.maximum(X, 0)})[0][0]
    )
