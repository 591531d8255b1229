"""analysis.onnx_pair against onnxruntime's own debugger and plain numpy on all frames at once.

A two-layer float model (MatMul, Add, Relu, MatMul) is quantized to QDQ by onnxruntime's
``quantize_static``; the streamed comparison (uneven batches) must give the pairs of
``create_activation_matching``, per pair the metrics numpy computes over the same
activations concatenated, and onnxruntime's SQNR (``compute_activation_error``, its own
per-frame runs) within 1e-3 dB.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from analysis import onnx_pair
from analysis.onnx_pair import compare_onnx_pair, match_pairs
from stages.onnx_runner import OnnxRunner

ort_quant = pytest.importorskip("onnxruntime.quantization")
from onnxruntime.quantization import qdq_loss_debug as dbg  # noqa: E402


class Reader(ort_quant.CalibrationDataReader):
    """One frame per call, as onnxruntime's examples feed its debugger."""

    def __init__(self, frames: np.ndarray) -> None:
        self.frames, self.i = frames, 0

    def get_next(self):
        if self.i >= len(self.frames):
            return None
        self.i += 1
        return {"x": self.frames[self.i - 1 : self.i]}


def tiny_float_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 6)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=6).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(size=(6, 3)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["mm"]),
        helper.make_node("Add", ["mm", "b1"], ["pre_relu"]),
        helper.make_node("Relu", ["pre_relu"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx_pair")
    f_path, q_path = folder / "float.onnx", folder / "qdq.onnx"
    onnx.save(tiny_float_model(), f_path)
    cal = np.random.default_rng(1).normal(size=(32, 1, 4)).astype(np.float32)
    ort_quant.quantize_static(
        str(f_path), str(q_path), Reader(cal.reshape(32, 4)),
        quant_format=ort_quant.QuantFormat.QDQ, activation_type=ort_quant.QuantType.QInt8,
        weight_type=ort_quant.QuantType.QInt8,
    )  # fmt: skip
    return folder, f_path, q_path


def collected(folder, path, frames) -> dict[str, list[np.ndarray]]:
    """onnxruntime's saved activations: per tensor, one flat array per frame."""
    aug = str(folder / (path.stem + ".aug.onnx"))
    dbg.modify_model_output_intermediate_tensors(str(path), aug)
    return dbg.collect_activations(aug, Reader(frames))


def reference(a: list[np.ndarray], b: list[np.ndarray]) -> dict[str, float]:
    """The metrics over all elements of all frames at once (concatenated), float64 numpy."""
    a, b = (np.concatenate(v).astype(np.float64).ravel() for v in (a, b))
    d = b - a
    return {
        "cosine": float(a @ b / math.sqrt((a @ a) * (b @ b))),
        "mse": float(np.mean(d * d)),
        "l1": float(np.mean(np.abs(d))),
        "max_abs": float(np.abs(d).max()),
        "sqnr_db": float(10 * math.log10((a @ a) / (d @ d))) if d.any() else math.inf,
    }


def captured(path, names, batches) -> dict[str, list[np.ndarray]]:
    """The tensors ``names`` of the same batches, run plainly and kept whole."""
    runner, out = OnnxRunner(path), {}
    for x in batches:
        got = runner.run_capture(x, [n for n in names if n != "x"])[1] | {"x": x}
        for n in names:
            out.setdefault(n, []).append(got[n])
    return out


def test_matches_onnxruntime_and_numpy_reference(models):
    folder, f_path, q_path = models
    frames = np.random.default_rng(2).normal(size=(23, 4)).astype(np.float32)
    pairs = match_pairs(onnx.load(str(f_path)), onnx.load(str(q_path)))
    batches = [frames[:10], frames[10:20], frames[20:]]
    got = compare_onnx_pair(f_path, q_path, pairs, batches)

    f_acts, q_acts = collected(folder, f_path, frames), collected(folder, q_path, frames)
    matching = dbg.create_activation_matching(q_acts, f_acts)
    assert set(got) == set(matching)
    assert {"x", "y"} <= set(got)  # the input, and the graph output (_QuantizeLinear_Input)
    errors = dbg.compute_activation_error(matching)
    f_all = captured(f_path, [p.name for p in pairs], batches)
    q_all = captured(q_path, [t for p in pairs for t in (p.pre, p.post)], batches)
    for p in pairs:
        r = got[p.name]
        sides = {"xmodel": (f_all[p.name], q_all[p.post]), "qdq": (q_all[p.pre], q_all[p.post])}
        for kind, (a, b) in sides.items():
            want, have = reference(a, b), getattr(r, kind)
            for k, v in want.items():
                assert have[k] == pytest.approx(v, rel=1e-9, abs=1e-15), (p.name, kind, k)
            ort_err = errors[p.name][f"{kind}_err"]
            assert r.sqnr_clamped(kind) == pytest.approx(ort_err, abs=1e-3), (p.name, kind)


def test_chunked_sums_do_not_change_the_aggregate(models, monkeypatch):
    """(Batches stay the same: onnxruntime's own float32 results change with the batch.)"""
    _, f_path, q_path = models
    frames = np.random.default_rng(3).normal(size=(9, 4)).astype(np.float32)
    pairs = match_pairs(onnx.load(str(f_path)), onnx.load(str(q_path)))
    batches = [frames[:4], frames[4:]]
    whole = compare_onnx_pair(f_path, q_path, pairs, batches)
    monkeypatch.setattr(onnx_pair, "CHUNK", 5)  # sums over 1-frame slices of each batch
    split = compare_onnx_pair(f_path, q_path, pairs, batches)
    for name, r in whole.items():
        for kind in ("xmodel", "qdq"):
            for k, v in getattr(r, kind).items():
                have = getattr(split[name], kind)[k]
                assert have == pytest.approx(v, rel=1e-9, abs=1e-15), (name, kind, k)
