"""Tests for the shared example weight cache (`examples.weights`) and each example's use of it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from examples import weights
from examples.colour import model as colour
from examples.digits import model as digits
from examples.transformer import model as transformer


def test_a_cache_miss_trains_once_and_a_second_build_loads(monkeypatch, tmp_path) -> None:
    """digits (the quickest to train), nothing shipped: build() trains and caches, a
    second build() loads the cached safetensors file instead of retraining."""
    monkeypatch.setattr(weights, "SHIPPED", tmp_path / "nothing-shipped")
    trained = digits.build(tmp_path)  # trains once on a cache miss
    path: Path = digits.cache_path(tmp_path)
    assert path.exists() and path.name.startswith("digits_cnn-")
    written = path.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("build() retrained despite a cached file")

    monkeypatch.setattr(digits, "_train", no_training)
    again = digits.build(tmp_path)
    assert not again.training
    assert path.stat().st_mtime_ns == written
    cached = load_file(path)
    for key, tensor in trained.state_dict().items():
        assert torch.equal(again.state_dict()[key], tensor)
        assert torch.equal(cached[key], tensor)


@pytest.mark.parametrize("name", list(weights.example_caches()))
def test_every_example_loads_its_current_shipped_weights(name: str, tmp_path) -> None:
    """A fresh clone trains nothing: each example's file for its current training key
    ships in examples/weights (else: python -m examples.weights)."""
    cache_path, build = weights.example_caches()[name]
    shipped = weights.SHIPPED / cache_path(tmp_path).name
    assert shipped.exists(), f"{shipped.name} not shipped: run python -m examples.weights"
    model = build(tmp_path)
    assert not list(tmp_path.iterdir())  # loaded, not trained into the cache
    for key, tensor in load_file(shipped).items():
        assert torch.equal(model.state_dict()[key], tensor)


def test_ship_keeps_current_files_and_drops_stale_ones(tmp_path) -> None:
    """Current files are kept as they are (nothing trains), a file no example names goes."""
    for f in weights.SHIPPED.glob("*.safetensors"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "digits_cnn-0000000000000000.safetensors").write_bytes(b"stale")
    kept = weights.ship(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)
    assert len(kept) == len(weights.example_caches())
    empty = tmp_path / "empty"  # a new folder: the shipped files copied, nothing trained
    for copied in weights.ship(empty):
        assert copied.read_bytes() == (weights.SHIPPED / copied.name).read_bytes()


def _tiny() -> torch.nn.Module:
    return torch.nn.Linear(3, 2)


def test_save_atomic_writes_key_and_leaves_no_temp_file(tmp_path: Path) -> None:
    """The file holds the state dict and the cache key; no temp file is left behind."""
    net = weights.untrained(_tiny, 0)
    path = tmp_path / "sub" / "tiny-abc.safetensors"
    weights.save_atomic(net, path, "abc")
    assert sorted(os.listdir(path.parent)) == [path.name]
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"cache_key": "abc"}
    assert torch.equal(load_file(path)["weight"], net.weight)


def test_load_or_train_trains_once(tmp_path: Path) -> None:
    """A miss calls train() and caches; a hit loads into make() without training."""
    path = weights.cache_file(tmp_path, None, "tiny", "k")
    assert path == tmp_path / "tiny-k.safetensors"
    calls = []

    def train() -> torch.nn.Module:
        calls.append(1)
        return weights.untrained(_tiny, 3).train()

    first = weights.load_or_train(path, "k", _tiny, train)
    second = weights.load_or_train(path, "k", _tiny, train)
    assert calls == [1] and not first.training and not second.training
    assert torch.equal(first.weight, second.weight)


def test_source_key_tracks_sources_and_hyperparameters() -> None:
    """The key is stable and changes with the objects, hyperparameters or extra fields."""
    key = weights.source_key([_tiny], {"lr": 1})
    assert key == weights.source_key([_tiny], {"lr": 1}) and len(key) == 16
    assert key != weights.source_key([_tiny], {"lr": 2})
    assert key != weights.source_key([_tiny, weights.fit], {"lr": 1})
    assert key != weights.source_key([_tiny], {"lr": 1}, format="rgb")


def test_single_thread_restores_the_thread_count() -> None:
    """Inside the block torch uses one thread; the previous count comes back after."""
    before = torch.get_num_threads()
    with weights.single_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_accuracy() -> None:
    """Top-1 of a model that always predicts class 0."""

    class Zero(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.long), 3).float()

    x = np.zeros((4, 1), np.float32)
    assert weights.accuracy(Zero(), x, np.array([0, 0, 1, 2])) == 0.5


@pytest.mark.parametrize("build", [digits.build_untrained, transformer.build_untrained])
def test_untrained_leaves_the_global_rng_alone(build: Callable[[], torch.nn.Module]) -> None:
    """build_untrained() neither reads nor advances the global torch RNG."""
    state = torch.random.get_rng_state()
    build()
    assert torch.equal(torch.random.get_rng_state(), state)


def test_examples_share_one_implementation() -> None:
    """The examples use the shared pieces rather than copies of them."""
    assert colour.accuracy is weights.accuracy
    assert colour.ConvBNReLU is digits.ConvBNReLU
    for module in (digits, transformer, colour):
        assert not hasattr(module, "_save_atomic") and not hasattr(module, "_single_thread")
