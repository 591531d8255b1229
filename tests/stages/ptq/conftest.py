"""Tiny ONNX float models for the PTQ chain tests: tests/models.py tiny() exported, and
graphs written with onnx.helper."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from pipelines.ptq import PtqSpec
from tests.models import tiny


def export_tiny(path: Path) -> Path:
    """tests.models.tiny() as ONNX (opset 17, BN kept, module-scoped node names)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(tiny(), (torch.zeros(1, 1, 8, 8),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"], opset_version=17,
                          dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
                          do_constant_folding=False)  # fmt: skip
    return path


def spec(**quant) -> PtqSpec:
    """A small PTQ spec on the tiny dataset of tests/models.py."""
    return PtqSpec.model_validate(
        {
            "model": {"file": "unused.onnx"},
            "data": {"dataset": "tests.models:data", "calibration_samples": 64,
                     "evaluation_samples": 64, "batch_size": 32, "probe_samples": 4},
            "quant": quant,
        }
    )  # fmt: skip


def helper_model(extra_op: str | None = None) -> onnx.ModelProto:
    """x[N,1,8,8] -> Conv -> BatchNormalization -> Identity -> Dropout -> Relu -> Flatten
    -> Gemm(transB=0, alpha=0.5) [-> ``extra_op``]: redundant ops and a non-canonical Gemm."""
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.normal(0, 0.3, (4, 1, 3, 3)), "b": rng.normal(0, 0.1, 4),
        "gamma": rng.uniform(0.5, 1.5, 4), "beta": rng.normal(0, 0.2, 4),
        "mean": rng.normal(0, 0.2, 4), "var": rng.uniform(0.5, 2.0, 4),
        "fc": rng.normal(0, 0.1, (256, 10)), "fc_b": rng.normal(0, 0.1, 10),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], name="bn"
        ),  # fmt: skip
        helper.make_node("Identity", ["n"], ["i"], name="identity"),
        helper.make_node("Dropout", ["i"], ["d"], name="dropout"),
        helper.make_node("Relu", ["d"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fc_b"], ["g"], name="fc", alpha=0.5),
    ]
    out = "g"
    if extra_op:
        nodes.append(helper.make_node(extra_op, ["g"], ["e"], name=f"my_{extra_op.lower()}"))
        out = "e"
    graph = helper.make_graph(
        nodes, "helper",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory) -> Path:
    return export_tiny(tmp_path_factory.mktemp("ptq_model") / "tiny.onnx")
