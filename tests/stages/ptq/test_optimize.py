"""optimized: rewrites that keep the float model's values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from stages.ptq.graph import attr
from stages.ptq.optimize import optimize


def _pool_model(ceil: int) -> onnx.ModelProto:
    """torchvision GoogLeNet's first pool: MaxPool 3x3 stride 2 with ``ceil_mode`` on 9x9."""
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[3, 3],
                            strides=[2, 2], ceil_mode=ceil)  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_a_ceil_mode_max_pool_becomes_floor_mode_with_the_same_values():
    """The integer QMaxPool has no ceil mode (convert dropped it: GoogLeNet's PTQ top-1 fell
    from 0.81 to 0.12): the end pads grow until floor mode gives the same output."""
    model = _pool_model(1)
    x = np.random.default_rng(0).standard_normal((1, 2, 10, 10)).astype(np.float32)
    out, _ = optimize(model)
    pool = next(n for n in out.graph.node if n.op_type == "MaxPool")
    assert attr(pool, "ceil_mode", 0) == 0 and list(attr(pool, "pads")) == [0, 0, 1, 1]
    want, got = _run(model, x), _run(out, x)
    assert want.shape == got.shape == (1, 2, 5, 5) and np.array_equal(want, got)
    floor, _ = optimize(_pool_model(0))  # floor mode is left alone
    assert attr(next(n for n in floor.graph.node if n.op_type == "MaxPool"), "pads") is None
