"""Own error per layer: golden inputs separate the error a layer adds from what it inherits."""

import json

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from analysis.single_layer import own_error_steps
from stages.capture import capture
from stages.pre_export import load_qat_export
from tests.stages.helpers import run_stages


def _setup(make_ctx):
    ctx = make_ctx(quant={"consistency_level": 2})
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export", "export", "convert")
    model = onnx.load(str(ctx.run.path(arts["convert"].onnx_file)))
    layers = json.loads(ctx.run.path(arts["convert"].layers_file).read_text())
    _, ref = capture(load_qat_export(arts["pre_export"], ctx), torch.from_numpy(ctx.evaluation.x))
    return model, layers, {k: v.numpy() for k, v in ref.items()}


def test_a_wrong_multiplier_is_charged_to_its_own_layer_only(make_ctx):
    model, layers, ref = _setup(make_ctx)
    before = own_error_steps(model, layers, ref)
    assert before["conv"][0] <= 1 and before["mean"][0] <= 1
    node = next(n for n in model.graph.node if n.op_type == "QConv" and "conv/" in n.name)
    init = next(i for i in model.graph.initializer if i.name == node.input[3])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
    after = own_error_steps(model, layers, ref)
    assert after["conv"][0] > 10 and after["conv"][1] > 0.5  # the broken layer
    for lid in before:
        if lid != "conv":
            assert after[lid] == before[lid], lid  # downstream layers: unchanged
    assert np.isfinite(list(v[0] for v in after.values())).all()
