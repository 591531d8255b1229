"""Ops without an integer form run as float islands through every PTQ stage: each one
between an input dequantize and its own output quantizer (comparisons: no quantizer),
listed by convert, run on the board's CPU side, the hbm bit-exact with quantized. PRelu
and Max get the op table's integer forms (Max of a broadcast operand too)."""

from __future__ import annotations

import duckdb
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipelines.ptq import run_ptq
from schemas.store import RunStore
from tests.stages.ptq.conftest import spec

ISLANDS = ["LayerNormalization", "Greater", "Where", "DepthToSpace", "SpaceToDepth", "Resize",
           "ConvTranspose", "ReduceMax", "Abs", "Pow", "GlobalMaxPool"]  # fmt: skip
INTEGER = ["PRelu", "Max"]  # the op table's integer forms (QClip + QAdd), broadcast too


def islands_model() -> onnx.ModelProto:
    """Conv -> the ops of ISLANDS in a row (as exporters write them) -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.normal(0, 0.3, s).astype(np.float32)  # noqa: E731
    inits = {"w": f(4, 1, 3, 3), "slope": f(4, 1, 1), "ln_s": f(8), "ln_b": f(8),
             "zero": np.float32(0), "sc": np.array([1, 1, 2, 2], np.float32),
             "wt": f(4, 4, 2, 2), "ax": np.array([1], np.int64), "two": np.float32(2),
             "fc": f(4, 10)}  # fmt: skip
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        n("PRelu", ["c", "slope"], ["p"]),
        n("LayerNormalization", ["p", "ln_s", "ln_b"], ["ln"], axis=-1),
        n("Greater", ["c", "zero"], ["mask"]),
        n("Where", ["mask", "ln", "c"], ["wh"]),
        n("DepthToSpace", ["wh"], ["d2s"], blocksize=2),
        n("SpaceToDepth", ["d2s"], ["s2d"], blocksize=2),
        n("Resize", ["s2d", "", "sc"], ["up"], mode="linear"),
        n("ConvTranspose", ["up", "wt"], ["ct"], strides=[2, 2]),
        n("ReduceMax", ["ct", "ax"], ["rmax"], keepdims=1),
        n("Abs", ["rmax"], ["abs"]),
        n("Pow", ["abs", "two"], ["sq"]),
        n("Max", ["ct", "sq"], ["mx"]),
        n("GlobalMaxPool", ["mx"], ["gmp"]),
        n("Flatten", ["gmp"], ["fl"]),
        n("Gemm", ["fl", "fc"], ["y"]),
    ]
    for k, node in enumerate(nodes):
        node.name = f"{node.op_type.lower()}_{k}"
    return _model(nodes, "islands", inits)


def _model(nodes, name: str, inits: dict) -> onnx.ModelProto:
    """x [N, 1, 8, 8] -> ``nodes`` -> y [N, 10], opset 18."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _run(model: onnx.ModelProto, tmp_path):
    """The PTQ chain on ``model``: the run (complete: hbm proved bit-exact against
    quantized) and its output cosine per stage."""
    path = tmp_path / f"{model.graph.name}.onnx"
    onnx.save(model, path)
    run = RunStore(tmp_path / "runs").open(run_ptq(path, spec(), tmp_path / "runs"))
    assert run.manifest().status == "complete"
    cosine = dict(duckdb.sql(
        f"SELECT stage, value FROM read_parquet('{run.root}/tables/metrics/**/*.parquet') "
        "WHERE metric = 'cosine'"
    ).fetchall())  # fmt: skip
    return run, cosine


def test_float_islands_run_every_ptq_stage_and_keep_agreement(tmp_path):
    run, cosine = _run(islands_model(), tmp_path)
    check = run.path("debug/model_check_result.txt").read_text()
    listed = {line.rsplit("_", 1)[0] for line in check[check.index("## float islands") :].split()}
    assert {op.lower() for op in ISLANDS} <= listed
    assert not {op.lower() for op in INTEGER} & listed
    assert cosine["board"] > 0.99 and cosine["hbm"] == cosine["quantized"]


def rest_model() -> onnx.ModelProto:
    """The rest of #20's op list, as exporters write them: Pad (reflect), Min with a
    constant, an Equal mask (of exact zeros) into Where, ReduceSum, and a LogSoftmax classifier output."""
    rng = np.random.default_rng(1)
    inits = {"w": rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32),
             "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "cap": np.float32(0.5),
             "zero": np.float32(0), "ax": np.array([1], np.int64),
             "fc": rng.normal(0, 0.3, (64, 10)).astype(np.float32)}  # fmt: skip
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w"], ["c"], name="conv"),
        n("Pad", ["c", "pads"], ["p"], name="pad", mode="reflect"),
        n("Min", ["p", "cap"], ["mn"], name="min"),
        n("Relu", ["mn"], ["r"], name="relu"),
        n("Equal", ["r", "zero"], ["mask"], name="equal"),
        n("Where", ["mask", "mn", "r"], ["wh"], name="where"),
        n("ReduceSum", ["wh", "ax"], ["rs"], name="reducesum", keepdims=1),
        n("Flatten", ["rs"], ["fl"], name="flatten"),
        n("Gemm", ["fl", "fc"], ["g"], name="gemm"),
        n("LogSoftmax", ["g"], ["y"], name="logsoftmax", axis=1),
    ]
    return _model(nodes, "rest", inits)


def test_the_rest_of_the_op_list_runs_every_ptq_stage(tmp_path):
    _, cosine = _run(rest_model(), tmp_path)
    assert cosine["board"] > 0.99 and cosine["hbm"] == cosine["quantized"]
