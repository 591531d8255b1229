"""flops per layer from prepare's layer table and the float weights' shapes."""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import save_file

from analysis.flops import WEIGHT_FILE, layer_flops, render_flops, union_shapes


def _layer(node, lid, op, inputs, k):
    return {"node": node, "layer_id": lid, "op_type": op, "inputs": inputs, "topo_index": k,
            "merged_into": None}  # fmt: skip


def test_conv_linear_matmul_flops_from_shapes(make_ctx):
    run = make_ctx().run
    records = [
        _layer("conv2d", "conv", "conv", ["x", "conv_weight", "conv_bias"], 0),
        _layer("relu", "relu", "relu", ["conv2d"], 1),
        _layer("linear", "fc", "linear", ["relu", "fc_weight"], 2),
        _layer("matmul", "mm", "matmul", ["linear", "linear"], 3),
    ]
    run.write_text("artifacts/prepare/layers.json", json.dumps(records))
    run.path(WEIGHT_FILE).parent.mkdir(parents=True, exist_ok=True)
    weights = {"conv.weight": np.zeros((8, 3, 3, 3), np.float32)}
    weights["fc.weight"] = np.zeros((10, 64), np.float32)
    save_file(weights, str(run.path(WEIGHT_FILE)))
    shapes = {"conv": (1, 8, 4, 4), "relu": (1, 8, 4, 4), "fc": (1, 2, 10), "mm": (1, 2, 2)}
    got = layer_flops(run, shapes)
    assert got == {
        "conv": 2 * 128 * 27,  # output elements x C_in x 3 x 3
        "relu": 0,
        "fc": 2 * 20 * 64,  # output elements x in_features
        "mm": 2 * 4 * 10,  # output elements x K (the linear's last dimension)
    }
    total = sum(got.values())
    assert render_flops("conv", got) == f"{got['conv']}({100 * got['conv'] / total:.2f}%)"
    assert render_flops("other", got) == "-"


def test_without_prepare_files_there_are_no_flops(make_ctx):
    assert layer_flops(make_ctx().run, {"conv": (1, 2)}) == {}


def test_shares_are_of_the_whole_model_not_of_one_pairs_layers(make_ctx):
    """compile -> board_sim captures relu, not the conv fused into it: head's share of
    that pair's flops alone would be 100%."""
    run = make_ctx().run
    records = [
        _layer("conv2d", "conv", "conv", ["x", "conv_weight"], 0),
        _layer("relu", "relu", "relu", ["conv2d"], 1),
        _layer("linear", "head", "linear", ["relu", "head_weight"], 2),
    ]
    run.write_text("artifacts/prepare/layers.json", json.dumps(records))
    run.path(WEIGHT_FILE).parent.mkdir(parents=True, exist_ok=True)
    weights = {"conv.weight": np.zeros((4, 1, 3, 3), np.float32)}
    save_file(weights | {"head.weight": np.zeros((10, 64), np.float32)}, str(run.path(WEIGHT_FILE)))
    float_pair = {"conv": (1, 4, 4, 4), "relu": (1, 4, 4, 4), "head": (1, 10)}
    compiled = {"relu": (1, 4, 4, 4), "head": (1, 10)}
    flops = layer_flops(run, union_shapes([compiled, float_pair]))
    assert flops == {"conv": 2 * 64 * 9, "relu": 0, "head": 2 * 10 * 64}
    assert render_flops("head", flops) == "1280(52.63%)"  # not 100.00%
