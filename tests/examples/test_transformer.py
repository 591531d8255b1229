"""Tests for the transformer example: a tiny ViT on the digits (export, training, cache)."""

from __future__ import annotations

import pytest
import torch

from examples import weights
from examples.transformer import model


@pytest.fixture(scope="module")
def trained() -> torch.nn.Module:
    """The trained model from `model.build()` (trains once on a cache miss)."""
    return model.build()


def _export(net: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    """Export ``net`` in eval mode with a dynamic batch dimension."""
    return torch.export.export(net.eval(), (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))


def test_export_dynamic_batch_matches_eager(splits: dict) -> None:
    """Traced on a batch of 2, the exported module runs a batch of 7 and matches eager."""
    net = model.build_untrained()
    x_eval = splits["evaluation"][0]
    exported = _export(net, torch.from_numpy(x_eval[:2]))
    x7 = torch.from_numpy(x_eval[:7])
    with torch.no_grad():
        eager = net(x7)
        torch.testing.assert_close(exported.module()(x7), eager)
    assert eager.shape == (7, 10)


def test_export_has_explicit_attention_ops(splits: dict) -> None:
    """The exported graph holds softmax, layer norm, gelu and matmuls, not a fused SDPA."""
    exported = _export(model.build_untrained(), torch.from_numpy(splits["evaluation"][0][:2]))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    text = " ".join(sorted(targets))
    for op in ("softmax", "layer_norm", "gelu", "matmul", "linear", "conv2d", "add"):
        assert op in text, f"{op} missing from {text}"
    assert "scaled_dot_product_attention" not in text


def test_untrained_is_seeded() -> None:
    """`build_untrained(seed)` is reproducible and differs across seeds."""
    a, b, c = model.build_untrained(0), model.build_untrained(0), model.build_untrained(1)
    assert not a.training
    assert torch.equal(a.head.weight, b.head.weight) and torch.equal(a.pos, b.pos)
    assert not torch.equal(a.head.weight, c.head.weight)


def test_module_paths() -> None:
    """Module paths the specs and overrides refer to exist, with the expected types."""
    names = dict(model.build_untrained().named_modules())
    for path in ("patch", "blocks.0.ln1", "blocks.0.q", "blocks.0.k", "blocks.0.v"):
        assert path in names
    for path in ("blocks.0.proj", "blocks.1.ln2", "blocks.1.fc1", "blocks.1.fc2", "norm"):
        assert path in names
    assert isinstance(names["blocks.0.ln1"], torch.nn.LayerNorm)
    assert isinstance(names["patch"], torch.nn.Conv2d)
    assert isinstance(names["head"], torch.nn.Linear) and names["head"].out_features == 10
    assert not any(isinstance(m, torch.nn.MultiheadAttention) for m in names.values())


def test_build_accuracy(trained: torch.nn.Module, splits: dict) -> None:
    """The trained model reaches >= 90% float top-1 on the 1000 evaluation frames."""
    assert not trained.training
    x, y = splits["evaluation"]
    assert len(y) == 1000
    assert weights.accuracy(trained, x, y) >= 0.90
