"""Constant-only ONNX chains fold into initializers; Q/DQ and input-fed nodes stay."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from stages.onnx_fold import fold_constant_nodes


def _model():
    """swin's bias: Gather(table, index) -> Reshape -> Add(x, .); a Q/DQ of a weight."""
    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(6, 2), "table")
    index = numpy_helper.from_array(np.array([5, 0, 3, 1], np.int64), "index")
    shape = numpy_helper.from_array(np.array([1, 8], np.int64), "shape")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    nodes = [
        helper.make_node("Gather", ["table", "index"], ["g"], name="bias/0", axis=0),
        helper.make_node("Reshape", ["g", "shape"], ["b"], name="bias/1"),
        helper.make_node("QuantizeLinear", ["b", "s"], ["bq"], name="bias/q"),
        helper.make_node("DequantizeLinear", ["bq", "s"], ["bd"], name="bias/dq"),
        helper.make_node("Add", ["x", "bd"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [table, index, shape, scale],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_gather_and_reshape_of_constants_fold_and_the_graph_computes_the_same():
    model = _model()
    folded, names = fold_constant_nodes(model)
    assert names == ["bias/0", "bias/1"]
    assert [n.op_type for n in folded.graph.node] == ["QuantizeLinear", "DequantizeLinear", "Add"]
    assert {i.name for i in folded.graph.initializer} == {"b", "s"}
    onnx.checker.check_model(folded)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ReferenceEvaluator(folded).run(None, {"x": x})[0], want)


def test_a_graph_without_constant_chains_is_returned_as_is():
    model = _model()
    del model.graph.node[:2]
    model.graph.node[0].input[0] = "x"
    out, names = fold_constant_nodes(model)
    assert out is model and names == []
