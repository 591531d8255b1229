"""CPU islands: any standard ONNX op, operands in ONNX order, equal to onnx's reference."""

import numpy as np
from onnx import helper
from onnx.reference import ReferenceEvaluator

from simulator.program.isa import Op
from tests.simulator.runtime.test_executor import execute

RNG = np.random.default_rng(0)


def _reference(op_type, inputs, **attrs):
    """The op by onnx's reference evaluator on named inputs (the integer graph's runner)."""
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["o"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, 1, None) for n in names],
        [helper.make_tensor_value_info("o", 1, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True)))[0]


def test_prelu_with_a_constant_slope_runs_on_the_cpu_side():
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1)
    attrs = {"op_type": "PRelu", "operands": "dc", "opset": 21}
    (y,) = execute(Op.CPU, [x], [slope], attrs)
    np.testing.assert_array_equal(y, _reference("PRelu", [x, slope]))


def test_a_constant_first_operand_keeps_its_place():
    """MatMul(const, x): buffers and constants are interleaved as the ONNX node had them."""
    w = RNG.standard_normal((5, 3)).astype(np.float32)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = execute(Op.CPU, [x], [w], {"op_type": "MatMul", "operands": "cd", "opset": 21})
    np.testing.assert_array_equal(y, _reference("MatMul", [w, x]))


def test_reductions_and_erf_with_attributes():
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    attrs = {"op_type": "ReduceSum", "operands": "dc", "keepdims": 0, "opset": 21}
    (y,) = execute(Op.CPU, [x], [np.array([1], np.int64)], attrs)
    np.testing.assert_array_equal(y, x.sum(axis=1))
    (y,) = execute(Op.CPU, [x], [], {"op_type": "Erf", "operands": "d", "opset": 21})
    np.testing.assert_array_equal(y, _reference("Erf", [x]))
