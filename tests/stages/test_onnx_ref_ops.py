"""The reference evaluator's bounded Conv (against onnxruntime) and the run that frees."""

from __future__ import annotations

import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from stages import onnx_ref_ops
from stages.onnx_ref_ops import Conv, run_kept

CASES = {  # id: (Conv attributes, x shape, w shape)
    "aspp_rate36_on_4x4": (dict(dilations=[36, 36], pads=[36] * 4), (2, 8, 4, 4), (6, 8, 3, 3)),
    "dilated_grouped_strided": (
        dict(dilations=[2, 3], pads=[1, 2, 3, 0], strides=[2, 1], group=2),
        (3, 4, 9, 11),
        (6, 2, 3, 3),
    ),
    "depthwise_strided": (
        dict(group=4, strides=[2, 2], pads=[1] * 4),
        (2, 4, 10, 10),
        (4, 1, 3, 3),
    ),
    "conv1d": (dict(dilations=[2], pads=[3, 1], strides=[3]), (2, 3, 17), (5, 3, 4)),
    "conv3d": (
        dict(pads=[1, 0, 1, 1, 0, 1], dilations=[1, 2, 1]),
        (2, 3, 5, 6, 5),
        (4, 3, 3, 2, 3),
    ),
    "same_upper": (dict(auto_pad="SAME_UPPER", strides=[2, 2]), (1, 3, 9, 8), (4, 3, 3, 3)),
    "same_lower": (dict(auto_pad="SAME_LOWER", strides=[3, 2]), (1, 3, 9, 8), (4, 3, 2, 3)),
    "valid": (dict(auto_pad="VALID", strides=[3, 2]), (1, 3, 9, 8), (4, 3, 2, 3)),
    "some_outputs_read_padding_only": (
        dict(pads=[5, 5, 0, 0], strides=[10, 10]),
        (1, 2, 3, 3),
        (2, 2, 1, 1),
    ),
    "end_pad_taps": (dict(pads=[0, 0, 7, 7], dilations=[4, 4]), (1, 2, 3, 3), (2, 2, 3, 3)),
}


def _conv_model(attrs: dict, bias: bool) -> onnx.ModelProto:
    names = ["x", "w", "b"] if bias else ["x", "w"]
    graph = helper.make_graph(
        [helper.make_node("Conv", names, ["y"], **attrs)],
        "conv",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("block", [onnx_ref_ops.BLOCK_BYTES, 64], ids=["frames", "rows"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_matches_onnxruntime(case, block, monkeypatch):
    """Float32 within float rounding, with whole-frame blocks and with one-row blocks."""
    monkeypatch.setattr(onnx_ref_ops, "BLOCK_BYTES", block)
    attrs, xs, ws = CASES[case]
    rng = np.random.default_rng(len(case))
    for bias in (False, True):
        model = _conv_model(attrs, bias)
        feeds = {"x": rng.standard_normal(xs, np.float32), "w": rng.standard_normal(ws, np.float32)}
        if bias:
            feeds["b"] = rng.standard_normal(ws[:1], np.float32)
        (want,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        (got,) = ReferenceEvaluator(model, new_ops=[Conv]).run(None, feeds)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dilated_conv_reads_only_its_taps():
    """An inf between the taps of a dilated kernel is not read: onnx's reference multiplies
    it by the dense kernel's inserted zeros (NaN); onnxruntime and Conv skip it."""
    model = _conv_model(dict(dilations=[2, 2]), bias=False)
    x = np.ones((1, 1, 5, 5), np.float32)
    x[0, 0, 1, 1] = np.inf  # between taps (0, 0) and (2, 2) of the output (0, 0)
    feeds = {"x": x, "w": np.ones((1, 1, 3, 3), np.float32)}
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    (got,) = ReferenceEvaluator(model, new_ops=[Conv]).run(None, feeds)
    np.testing.assert_array_equal(got, want)
    assert want[0, 0, 0, 0] == 9.0


class _Tracked(np.ndarray):
    """An array a weak reference can follow (plain ndarrays take none)."""


def test_run_kept_drops_each_tensor_after_its_last_consumer():
    """x -> Keep (a) -> Neg (b) -> Probe (c): when Probe runs, ``a`` is gone unless kept."""
    alive: dict[str, bool] = {}
    refs: list[weakref.ref] = []

    class Keep(OpRun):
        op_domain = "test"

        def _run(self, x):
            out = (x + 1).view(_Tracked)
            refs.append(weakref.ref(out))
            return (out,)

    class Probe(OpRun):
        op_domain = "test"

        def _run(self, x):
            alive["a"] = refs[-1]() is not None
            return (x * 2,)

    graph = helper.make_graph(
        [helper.make_node("Keep", ["x"], ["a"], domain="test"),
         helper.make_node("Neg", ["a"], ["b"]),
         helper.make_node("Probe", ["b"], ["c"], domain="test")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("test", 1)]
    ev = ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets), new_ops=[Keep, Probe])
    x = np.array([1.0, 2.0], np.float32)
    got = run_kept(ev, {"x": x}, ["c"])
    assert list(got) == ["c"] and got["c"].tolist() == [-4.0, -6.0]
    assert alive == {"a": False}
    got = run_kept(ev, {"x": x}, ["c", "a"])
    assert alive == {"a": True} and got["a"].tolist() == [2.0, 3.0]
