"""A tiny ONNX graph with two float inputs and two outputs, and its dataset, for the PTQ
chain's several-inputs/several-outputs contract (stages/ptq/feeds.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

N_CAL, N_EVAL = 32, 16


def two_io(int_input: bool = False) -> onnx.ModelProto:
    """``x`` [N,1,8,8] and ``m`` [N,4] (int64 with ``int_input``) -> Conv -> Relu, then
    ``shifted = Gemm(Flatten(r)) + m`` and ``pooled = Flatten(GlobalAveragePool(r))``,
    both [N,4]. ``m`` is read after ``x``'s first layer, so a wrong feed changes
    ``shifted`` only."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.normal(0, 0.4, (4, 1, 3, 3)), "b": rng.normal(0, 0.1, 4),
             "fc": rng.normal(0, 0.1, (256, 4)), "fc_b": rng.normal(0, 0.1, 4)}  # fmt: skip
    m = "m"
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fc_b"], ["g"], name="fc"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["pooled"], name="pool_flat"),
    ]
    if int_input:
        nodes.append(helper.make_node("Cast", ["m"], ["mf"], name="cast", to=TensorProto.FLOAT))
        m = "mf"
    nodes.append(helper.make_node("Add", ["g", m], ["shifted"], name="shift"))
    m_type = TensorProto.INT64 if int_input else TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "two_io",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8]),
         helper.make_tensor_value_info("m", m_type, ["N", 4])],
        [helper.make_tensor_value_info("shifted", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def embedding() -> onnx.ModelProto:
    """int64 ``ids`` [N,6] -> Gather of a constant table [20,8] (an embedding) -> MatMul
    [8,4] -> ``y`` [N,6,4]: an integer input read only as embedding indices."""
    rng = np.random.default_rng(4)
    inits = {"table": rng.normal(0, 1, (20, 8)), "w": rng.normal(0, 0.3, (8, 4))}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="emb"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="fc")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def write(path: Path, int_input: bool = False) -> Path:
    onnx.save(two_io(int_input), str(path))
    return path


def ids_data() -> dict:
    """Token ids for :func:`embedding`, no labels."""
    rng = np.random.default_rng(5)
    return {k: {"inputs": {"ids": rng.integers(0, 20, (n, 6)).astype(np.int64)}, "labels": None}
            for k, n in (("train", N_CAL), ("evaluation", N_EVAL))}  # fmt: skip


def inputs(n: int, seed: int) -> dict[str, np.ndarray]:
    """``m`` listed first: the chain must feed by name, not by the dataset's order."""
    rng = np.random.default_rng(seed)
    m = rng.normal(0, 2.0, (n, 4)).astype(np.float32)
    return {"m": m, "x": rng.normal(0, 1, (n, 1, 8, 8)).astype(np.float32)}


def data() -> dict:
    """Both inputs by name, labelled by ``shifted``'s arg-max on the float graph."""
    from stages.onnx_runner import OnnxRunner

    runner = OnnxRunner(two_io())
    splits = {}
    for name, n, seed in (("train", N_CAL, 0), ("evaluation", N_EVAL, 1)):
        xs = inputs(n, seed)
        labels = np.argmax(runner.run(xs)[0], axis=1).astype(np.int64)
        splits[name] = {"inputs": xs, "labels": labels}
    return splits


def renamed_data() -> dict:
    """The same data with ``m`` named ``mask``: not the graph's input names."""
    return {
        k: {"inputs": {"mask" if n == "m" else n: a for n, a in v["inputs"].items()},
            "labels": v["labels"]}
        for k, v in data().items()
    }  # fmt: skip
