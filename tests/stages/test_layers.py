"""Canonical layer ids and the op table on exported graphs."""

import torch
from torch import nn

from stages.layers import ID_KEY, Category, assign_layer_ids, module_call_counts
from stages.modelio import export_graph
from tests.models import cumsum, tiny


class Shared(nn.Module):
    """One ReLU module called twice, and a block with its own functional add."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.act = nn.ReLU()

    def forward(self, x):
        y = self.act(self.conv(x))
        return self.act(y + y) * 2.0


def _ids(model, shape=(2, 1, 8, 8)):
    gm = export_graph(model.eval(), torch.randn(*shape))
    return gm, assign_layer_ids(gm)


def test_ids_are_module_paths_and_ops_inside_modules():
    gm, infos = _ids(tiny())
    ids = [i.layer_id for i in infos]
    assert ids == [
        "conv",
        "bn",
        "relu",
        "conv2",
        "add",
        "relu_1",
        "pool",
        "mean",
        "sigmoid",
        "mul",
        "reshape",
        "head",
    ]
    assert all(n.meta[ID_KEY] for n in gm.graph.nodes if n.op == "call_function")


def test_repeated_module_call_gets_call_suffix_and_is_reported():
    gm, infos = _ids(Shared())
    ids = [i.layer_id for i in infos]
    assert ids == ["conv", "act", "add", "act@1", "mul"]
    assert module_call_counts(gm) == {"act": 2}


def test_categories_and_unsupported():
    _, infos = _ids(cumsum())
    by_id = {i.layer_id: i for i in infos}
    assert by_id["conv"].category is Category.WEIGHTED
    assert by_id["sigmoid"].category is Category.LUT
    assert by_id["pool"].category is Category.PASSTHROUGH
    assert not by_id["cumsum"].supported and by_id["cumsum"].op_type == "cumsum"


def test_standalone_batch_norm_keeps_its_id_through_prepare():
    from stages.modelio import prepare_qat
    from stages.quantizer import QuantPolicy

    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.BatchNorm2d(2)).eval()
    gm, _, _ = prepare_qat(model, torch.randn(2, 1, 4, 4), QuantPolicy())
    ids = {n.meta.get(ID_KEY) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"0", "1", "2"} <= ids
