"""model.input_shapes and the size computations folded at original: a detector-style
graph exported with dynamic batch, height and width."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipelines.ptq import run_ptq
from schemas.errors import StageError
from schemas.store import RunStore
from stages.onnx_runner import OnnxRunner
from stages.ptq import batch
from stages.ptq.original import check_model, unsupported
from stages.ptq.shapes import fix_input_shapes, fold_shapes, render_folded
from tests.models import data
from tests.stages.ptq import batch_models
from tests.stages.ptq.conftest import spec


def _node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def dynamic_detector() -> onnx.ModelProto:
    """x[N,1,H,W] -> Conv -> Relu, plus an anchor grid (Shape/Gather/Range/Cast), a mask of
    ones (Mul/Unsqueeze/ConstantOfShape) and a head flattening to Concat(Shape[0:1], 4, -1)
    as exporters write them; then Flatten -> Gemm (H = W = 8)."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32),
             "fc": rng.normal(0, 0.1, (256, 10)).astype(np.float32),
             "zero": np.array(0, np.int64), "one": np.array(1, np.int64),
             "two": np.array(2, np.int64), "three": np.array(3, np.int64),
             "s0": np.array([0], np.int64), "s1": np.array([1], np.int64),
             "ax0": np.array([0], np.int64), "four_m1": np.array([4, -1], np.int64)}  # fmt: skip
    nodes = [
        _node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
        _node("Relu", ["conv"], ["relu"]),
        _node("Shape", ["relu"], ["shape"]),
        _node("Gather", ["shape", "three"], ["width"]),
        _node("Range", ["zero", "width", "one"], ["grid"]),
        _node("Cast", ["grid"], ["grid_f"], to=TensorProto.FLOAT),
        _node("Add", ["relu", "grid_f"], ["anchored"]),
        _node("Gather", ["shape", "two"], ["height"]),
        _node("Mul", ["height", "width"], ["cells"]),
        _node("Unsqueeze", ["cells", "ax0"], ["cells_1d"]),
        _node(
            "ConstantOfShape",
            ["cells_1d"],
            ["ones"],
            value=numpy_helper.from_array(np.array([0.5], np.float32)),
        ),  # fmt: skip
        _node("Slice", ["shape", "s0", "s1"], ["batch"]),
        _node("Concat", ["batch", "four_m1"], ["target"], axis=0),
        _node("Reshape", ["anchored", "target"], ["flat"]),
        _node("Mul", ["flat", "ones"], ["scaled"]),
        _node("Flatten", ["scaled"], ["features"]),
        _node("Gemm", ["features", "fc"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_dynamic_height_and_width_without_input_shapes_name_the_dims_and_the_field(tmp_path):
    path = tmp_path / "det.onnx"
    onnx.save(dynamic_detector(), path)
    with pytest.raises(StageError, match=r"x: dim 2 \(H\), dim 3 \(W\)") as e:
        run_ptq(path, spec(), tmp_path / "runs")
    assert e.value.where == "model.input_shapes" and "[1, 'N', 'N', 'N']" in e.value.hint


def test_folding_keeps_the_batch_dynamic_and_the_numbers():
    model = dynamic_detector()
    fix_input_shapes(model, {"x": [1, 1, 8, 8]}, "det.onnx")
    folded_model, folded, _ = fold_shapes(model)
    ops = [n.op_type for n in folded_model.graph.node]
    assert ops == ["Conv", "Relu", "Add", "Reshape", "Mul", "Flatten", "Gemm"]
    assert {n.op_type for n in folded} >= {"Shape", "Gather", "Range", "Cast", "ConstantOfShape"}
    target = next(i for i in folded_model.graph.initializer if i.name.startswith("target"))
    assert numpy_helper.to_array(target).tolist() == [0, 4, -1]  # the batch is copied
    x = data()["evaluation"][0][:5]
    want = OnnxRunner(model).run(x)[0]
    np.testing.assert_allclose(OnnxRunner(folded_model).run(x)[0], want, rtol=1e-6, atol=1e-6)


def test_input_shapes_errors_name_the_input():
    with pytest.raises(StageError, match=r"names input 'images'.*\['x'\]"):
        fix_input_shapes(dynamic_detector(), {"images": [1, 1, 8, 8]}, "det.onnx")
    with pytest.raises(StageError, match=r"rank 4") as e:
        fix_input_shapes(dynamic_detector(), {"x": [1, 8, 8]}, "det.onnx")
    assert e.value.where == "model.input_shapes.x"


def test_a_detector_with_dynamic_dims_runs_every_stage_once_its_shapes_are_set(tmp_path):
    path = tmp_path / "det.onnx"
    onnx.save(dynamic_detector(), path)
    s = spec()
    s = s.model_copy(
        update={"model": s.model.model_copy(update={"input_shapes": {"x": [1, 1, 8, 8]}})}
    )
    run = RunStore(tmp_path / "runs").open(run_ptq(path, s, tmp_path / "runs"))
    assert run.manifest().status == "complete"
    check = run.path("debug/model_check_result.txt").read_text()
    assert "## shape computations folded into constants" in check and "Range: 1" in check


def _folded_equal(model: onnx.ModelProto, frames: int = 3):
    """fold_shapes of ``model``; its outputs equal the model's on ``frames`` frames."""
    folded = fold_shapes(check_model(model, "m.onnx"))
    x = data()["evaluation"][0][:frames]
    assert batch.prove_same(model, folded.model, x, None) == 0.0
    return folded


def test_a_class_token_expanded_to_the_batch_reads_the_batch_size_at_run_time():
    folded = _folded_equal(batch_models.class_token())
    ops = [n.op_type for n in folded.model.graph.node]
    assert ops[3:6] == ["Shape", "Concat", "Expand"] and "Slice" not in ops
    shape = next(n for n in folded.model.graph.node if n.op_type == "Shape")
    assert shape.input[0] == "x" and unsupported(folded.model) == []
    assert any(r.startswith("Expand ce:") for r in folded.rewrites)


def test_a_rewritten_target_is_not_rewritten_again_so_folding_ends():
    """The class token's new target ``Concat(Shape(x)[0:1], [1, 4])`` still follows the
    batch in the next pass: rewritten again, every pass rewrote it anew up to PASSES
    (TorchScript's vit_b_16: 64 passes, each pass's model kept alive, out of memory)."""
    folded = fold_shapes(check_model(batch_models.class_token(), "m.onnx"))
    assert folded.rewrites == ["Concat target/folded/target: target/folded = [1, 4]",
                               "Expand ce: target/folded/target = Concat"]  # fmt: skip
    assert [n.op_type for n in folded.nodes] == ["Shape", "Slice", "Concat"]


@pytest.mark.parametrize("opset, want", [(18, "sizes = [8, 8] on axes [2, 3]"),
                                         (17, "scales = [1.0, 1.0, 2.0, 2.0]")])  # fmt: skip
def test_resize_sizes_from_shape_become_constant_spatial_sizes(opset, want):
    folded = _folded_equal(batch_models.upsample(opset=opset))
    assert [n.op_type for n in folded.model.graph.node] == ["Conv", "Resize"]
    assert len(folded.rewrites) == 1 and want in folded.rewrites[0]


def test_a_reshape_target_that_is_a_multiple_of_the_batch_infers_it():
    folded = _folded_equal(batch_models.windows())
    assert [n.op_type for n in folded.model.graph.node] == [
        "Conv", "Reshape", "ReduceMean", "Reshape", "MatMul"]  # fmt: skip
    assert folded.rewrites == ["Reshape win: target/folded = [-1, 4, 4, 4]"]
    assert "Reshape win: target/folded = [-1, 4, 4, 4]" in render_folded(folded)


def test_a_shape_left_after_folding_is_refused_naming_the_node_and_input_shapes(tmp_path):
    path = tmp_path / "win.onnx"
    onnx.save(batch_models.windows(rest=(-1, 4, 4)), path)
    with pytest.raises(StageError, match=r"Shape \(node shape\)") as e:
        run_ptq(path, spec(), tmp_path / "runs")
    assert "model.input_shapes with dim 0" in e.value.hint


def two_pass_model() -> onnx.ModelProto:
    """x [N, 8, 2] -> Reshape to [N, 8 / 2 (a Div shape inference does not propagate), 4]
    -> a second Reshape whose target reads the first one's Shape: it folds only once the
    first target is a constant and the first output's shape is inferred again."""
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["s"], name="shape_x"),
        n("Gather", ["s", "i1"], ["c"], name="gather_c", axis=0),
        n("Div", ["c", "two"], ["half"], name="div"),
        n("Concat", ["zero", "half", "four"], ["t1"], name="cat1", axis=0),
        n("Reshape", ["x", "t1"], ["y"], name="reshape1"),
        n("Shape", ["y"], ["sy"], name="shape_y"),
        n("Slice", ["sy", "i1", "i3"], ["tail"], name="slice_y"),
        n("Concat", ["zero", "tail"], ["t2"], name="cat2", axis=0),
        n("Reshape", ["y", "t2"], ["z"], name="reshape2"),
    ]
    consts = {"i1": [1], "i3": [3], "two": [2], "zero": [0], "four": [4]}
    graph = helper.make_graph(
        nodes, "two_pass",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in consts.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_size_computations_fold_pass_after_pass(monkeypatch):
    model = two_pass_model()
    folded = fold_shapes(model)
    assert not [n for n in folded.model.graph.node if n.op_type == "Shape"]
    x = np.arange(3 * 16, dtype=np.float32).reshape(3, 8, 2)
    np.testing.assert_array_equal(OnnxRunner(folded.model).run(x)[0], OnnxRunner(model).run(x)[0])
    monkeypatch.setattr("stages.ptq.shapes.PASSES", 1)  # one pass leaves shape_y
    assert [n.name for n in fold_shapes(model).model.graph.node if n.op_type == "Shape"]


def test_shape_nodes_that_do_not_fold_at_the_fixed_batch_are_named():
    """A Shape of a data-dependent size (NonZero) folds at no batch: with input_shapes'
    dim 0 given, original names it and what to do instead of walking the batch."""
    n = helper.make_node
    nodes = [n("NonZero", ["x"], ["nz"], name="nonzero"),
             n("Shape", ["nz"], ["s"], name="shape_nz"),
             n("Reshape", ["x", "s"], ["y"], name="reshape")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "left",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(StageError, match=r"1 Shape node\(s\) do not fold even with the batch "
                       r"fixed at 1: shape_nz") as e:  # fmt: skip
        batch.dynamic_batch(model, {"x": [1, 2]})
    assert e.value.where == "model.input_shapes / node shape_nz"
