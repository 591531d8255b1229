"""compile_graph: a ReLU6 (QClip keeping 0) after a requantizing conv becomes the conv's
``clip`` bounds, and the program still computes quantized.onnx's integers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from simulator.program.isa import Op
from simulator.runtime.executor import Executor
from stages.compile import tensor_shapes
from stages.compile_graph import Compiler
from stages.onnx_runner import OnnxRunner


def _model(clips: list[tuple[int, int]], group: int = 1) -> onnx.ModelProto:
    """x -> QuantizeLinear -> QConv 3x3 (8 -> 8 channels, ``group``) -> one QClip per
    entry of ``clips`` (each reading the conv) -> DequantizeLinear each."""
    rng = np.random.default_rng(5)
    c = 8
    inits = {"s": np.float32(0.05), "z": np.int8(0), "ds": np.float32(0.1), "dz": np.int8(0),
             "w": rng.integers(-128, 128, (c, c // group, 3, 3), dtype=np.int8),
             "b": rng.integers(-3000, 3000, c).astype(np.int32),
             "m": rng.integers(2**10, 2**14, c).astype(np.int64), "sh": np.full(c, 18, np.int64)}  # fmt: skip
    conv = helper.make_node("QConv", ["xq", "w", "b", "m", "sh"], ["y"], name="conv",
                            domain="qparity", strides=[1, 1], pads=[1, 1, 1, 1],
                            dilations=[1, 1], group=group, out_dtype="int8", relu=0,
                            rounding="half_even")  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="input"), conv]
    outs = []
    for i, (lo, hi) in enumerate(clips):
        nodes += [helper.make_node("QClip", ["y"], [f"r{i}"], name=f"clip{i}", domain="qparity",
                                   lo=lo, hi=hi),
                  helper.make_node("DequantizeLinear", [f"r{i}", "ds", "dz"], [f"out{i}"],
                                   name=f"dq{i}")]  # fmt: skip
        outs.append(helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [None, 8, 7, 7]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, c, 7, 7])
    graph = helper.make_graph(nodes, "g", [x], outs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])  # fmt: skip
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("qparity", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _compiled(tmp_path, model: onnx.ModelProto):
    """(program, quantized.onnx's outputs, the program's) on random frames."""
    path = tmp_path / "quantized.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(1).normal(0, 2, (2, 8, 7, 7)).astype(np.float32)
    program = Compiler(model, "nash-e", 16, tensor_shapes(path, model, x)).run({})
    want = OnnxRunner(path).run(x)
    got = list(Executor(program).run({"x": x})[0].values())
    return program, want, got


@pytest.mark.parametrize("group", [1, 8])
def test_relu6_fuses_into_the_conv_as_its_clip_bounds(tmp_path, group):
    program, want, got = _compiled(tmp_path, _model([(0, 40)], group))
    ops = [i.op for i in program.instructions]
    assert Op.CLIP not in ops
    conv = next(i for i in program.instructions if i.op is Op.CONV)
    assert conv.attrs["clip"] == [0, 40] and conv.layer_ids == ("conv", "clip0")
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (want[0] == 40 * 0.1).any()  # some outputs reach the clip's bound


@pytest.mark.parametrize("clips", [[(3, 40)], [(0, 40), (0, 20)]])
def test_a_clip_moving_0_or_one_of_several_users_stays_an_instruction(tmp_path, clips):
    """lo > 0 would turn an nhwc buffer's zero padding channels into lo; a conv read by
    two clips keeps its own output."""
    program, want, got = _compiled(tmp_path, _model(clips))
    assert [i.op for i in program.instructions].count(Op.CLIP) == len(clips)
    assert all("clip" not in i.attrs for i in program.instructions)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
