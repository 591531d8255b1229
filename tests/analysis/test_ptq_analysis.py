"""A PTQ run's flops: from the weight initializers its QDQ graph quantizes."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from analysis.layer_graph import Layer
from analysis.ptq_analysis import onnx_flops
from stages.ptq.graph import set_layer


def _weight_q(lid: str, init: str, axis: int):
    node = helper.make_node("QuantizeLinear", [init, "s", "zp"], [f"{lid}[weight]/q:0"],
                            name=f"{lid}[weight]/q", axis=axis)  # fmt: skip
    set_layer(node, lid)
    return node


def test_conv_gemm_and_weight_matmul_flops_from_the_quantized_initializers():
    weights = {"cw": (4, 1, 3, 3), "fw": (10, 64), "mw": (64, 8)}
    inits = [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in weights.items()]
    nodes = [_weight_q("conv", "cw", 0), _weight_q("fc", "fw", 0), _weight_q("mm", "mw", 1)]
    graph = helper.make_graph(nodes, "g", [], [], initializer=inits)
    layers = {lid: Layer(lid, op, k, ()) for k, (lid, op) in enumerate(
        [("conv", "conv"), ("relu", "relu"), ("fc", "gemm"), ("mm", "matmul"), ("att", "matmul")])}  # fmt: skip
    shapes = {"conv": (1, 4, 8, 8), "relu": (1, 4, 8, 8), "fc": (1, 10), "mm": (1, 8),
              "att": (1, 4, 4)}  # fmt: skip
    assert onnx_flops(helper.make_model(graph), layers, shapes) == {
        "conv": 2 * 256 * 9,  # output elements x C_in x 3 x 3
        "relu": 0,
        "fc": 2 * 10 * 64,  # out features x in features
        "mm": 2 * 8 * 64,  # weight [K, N], axis 1: output elements x K
    }  # a MatMul of two activations ("att") has no known K: left out ("-")
