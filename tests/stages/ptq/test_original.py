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


def test_the_dynamo_exporters_scopes_give_the_qat_chains_ids_too(tmp_path):
    """torch.onnx.export(dynamo=True) keeps no scoped names but a ``name_scopes`` list per
    node; its optimizer fuses each batch norm into the conv before it, which then carries
    the norm's scope (``layer1.0.bn1``, not ``layer1.0.conv1``)."""
    model = onnx.load(onnx_export.dynamo_small_resnet18(tmp_path / "r.onnx"))
    assign_layer_ids(model)
    ptq = {layer_of(n) for n in model.graph.node}
    _, infos, _ = prepare_qat(build("resnet18", 64), torch.randn(2, 3, 64, 64), QuantPolicy())
    qat = {i.layer_id for i in infos}
    shared = {"relu", "maxpool", "layer1.0", "layer1.0.relu", "layer1.0.relu@1", "fc"}
    assert shared <= ptq & qat
    assert "layer1.0.bn1" in ptq and "layer1.0.conv1" not in ptq  # the fused conv


def test_dynamo_name_scopes_number_a_modules_later_calls():
    def node(op: str, scopes: str, name: str) -> onnx.NodeProto:
        n = onnx.helper.make_node(op, ["a"], ["b"], name=name)
        n.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=scopes)
        return n

    nodes = [node("Relu", "['', 'block', 'block.act', 'relu']", "r0"),
             node("Relu", "['', 'block', 'block.act', 'relu_1']", "r1"),
             node("Add", "['', 'block', 'add']", "a0"),
             node("Add", "['', 'add_1']", "a1"),
             node("Relu", "not a list", "r2")]  # fmt: skip
    model = onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", [], []))
    assert list(assign_layer_ids(model).values()) == [
        "block.act", "block.act@1", "block", "a1", "r2"
    ]  # fmt: skip
