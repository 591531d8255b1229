"""original: layer ids from the exporter's scopes are the QAT chain's ids of the same
modules, so a QAT run and a PTQ run of one architecture line up layer by layer."""

from __future__ import annotations

import onnx
import torch

from examples.zoo import onnx_export
from examples.zoo.models import build
from stages.modelio import prepare_qat
from stages.ptq.graph import layer_of
from stages.ptq.original import assign_layer_ids
from stages.quantizer import QuantPolicy


def test_torchvision_resnet18_gets_the_qat_chains_layer_ids(tmp_path):
    model = onnx.load(onnx_export.small_resnet18(tmp_path / "r.onnx"))
    assign_layer_ids(model)
    ptq = {layer_of(n) for n in model.graph.node}
    _, infos, _ = prepare_qat(build("resnet18", 64), torch.randn(2, 3, 64, 64), QuantPolicy())
    qat = {i.layer_id for i in infos}
    assert {"layer2.0.downsample.0", "layer1.0.conv1", "layer1.0.relu@1", "fc"} <= ptq & qat
    assert qat - ptq == {"reshape"}  # torch.flatten: "Flatten" in the TorchScript export
