"""Capture on a graph with multi-output ops: torchvision's ShuffleNetV2 block (chunk)."""

import torch

from examples.zoo import libs
from stages.capture import capture
from stages.modelio import prepare_qat
from stages.quantizer import QuantPolicy

InvertedResidual = libs.torchvision().models.shufflenetv2.InvertedResidual  # examples/zoo/libs.py


def test_every_captured_value_is_a_tensor_and_the_chunks_are_captured():
    torch.manual_seed(0)
    block = InvertedResidual(8, 8, 1).eval()
    x = torch.randn(2, 8, 6, 6)
    gm, infos, _ = prepare_qat(block, x, QuantPolicy())
    out, values = capture(gm, x)
    assert all(isinstance(v, torch.Tensor) for v in values.values())
    chunk = next(i for i in infos if i.node == "chunk")
    items = [i.layer_id for i in infos if i.inputs == (chunk.node,)]
    assert len(items) == 2 and all(lid in values for lid in items)  # each half
    assert chunk.layer_id not in values  # the pair itself is no tensor
    assert torch.equal(out, gm(x))
