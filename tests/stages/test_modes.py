"""stages.modes against torchao's move_exported_model_to_eval / _to_train: the same graph,
on models with and without dropout and batch norm, and the pattern tracing skipped when
the graph cannot match."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torchao.quantization.pt2e import export_utils
from torchao.quantization.pt2e import move_exported_model_to_eval as ao_to_eval
from torchao.quantization.pt2e import move_exported_model_to_train as ao_to_train

from stages import modes


def _with(dropout: bool, bn: bool) -> nn.Module:
    layers = [nn.Conv2d(3, 4, 3)]
    layers += [nn.BatchNorm2d(4)] if bn else []
    layers += [nn.ReLU(), nn.Flatten()]
    layers += [nn.Dropout(0.3)] if dropout else []
    return nn.Sequential(*layers, nn.Linear(4 * 6 * 6, 5))


def _exported(model: nn.Module) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    model.train()
    return torch.export.export(model, (torch.randn(2, 3, 8, 8),), strict=False).module()


@pytest.mark.parametrize("dropout, bn", [(True, True), (True, False), (False, True), (False, False)])
def test_the_graph_is_torchaos_in_both_directions(dropout, bn):
    torch.manual_seed(0)
    gm = _exported(_with(dropout, bn))
    ours, theirs = copy.deepcopy(gm), copy.deepcopy(gm)
    modes.to_eval(ours), ao_to_eval(theirs)
    assert ours.code == theirs.code
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(ours(x), theirs(x))  # eval: deterministic, no batch statistics
    modes.to_train(ours), ao_to_train(theirs)
    assert ours.code == theirs.code
    for marked in (ours, theirs):
        assert getattr(marked, export_utils._EXPORTED_TRAINING_ATTR) is True


def test_a_graph_without_dropout_or_batch_norm_traces_no_pattern(monkeypatch):
    gm = _exported(_with(dropout=False, bn=False))
    traced = []
    monkeypatch.setattr(modes, "REWRITES", tuple((n, lambda *a, n=n, **k: traced.append(n))
                                                 for n, _ in modes.REWRITES))  # fmt: skip
    modes.to_eval(gm)
    assert traced == []
    with_both = _exported(_with(dropout=True, bn=True))
    modes.to_eval(with_both)
    assert traced == ["dropout", "batch_norm"]


def test_a_second_move_the_same_way_does_nothing(monkeypatch):
    gm = modes.to_eval(_exported(_with(dropout=True, bn=True)))
    monkeypatch.setattr(modes, "REWRITES", ())  # would fail below if it ran: nothing to unpack
    monkeypatch.setattr(modes, "holds", lambda *a: pytest.fail("moved twice"))
    assert modes.to_eval(gm) is gm
