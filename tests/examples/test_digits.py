"""Tests for the bundled digits example: data split, model export, training and cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from examples import weights
from examples.digits import data, model


@pytest.fixture(scope="module")
def trained() -> torch.nn.Module:
    """The trained model from `model.build()` (trains once on a cache miss)."""
    return model.build()


def test_split_sizes_shapes_dtypes(splits: dict) -> None:
    """Splits hold 797 train / 1000 evaluation NCHW float32 frames in [-1, 1], int64 labels."""
    assert set(splits) == {"train", "evaluation"}
    x_train, y_train = splits["train"]
    x_eval, y_eval = splits["evaluation"]
    assert x_train.shape == (797, 1, 8, 8) and y_train.shape == (797,)
    assert x_eval.shape == (1000, 1, 8, 8) and y_eval.shape == (1000,)
    for x, y in (splits["train"], splits["evaluation"]):
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert x.min() == -1.0 and x.max() == 1.0
        assert set(np.unique(y)) == set(range(10))


def test_split_is_stratified_and_partitions_the_dataset(splits: dict) -> None:
    """Every class is well represented and train + evaluation is exactly the full dataset."""
    y_train, y_eval = splits["train"][1], splits["evaluation"][1]
    assert np.bincount(y_eval, minlength=10).min() >= 95
    assert np.bincount(y_train, minlength=10).min() >= 75
    full = load_digits()
    together = np.concatenate([splits["train"][0], splits["evaluation"][0]]).reshape(1797, -1)
    expected = (full.images.reshape(1797, -1).astype(np.float32) / 16 - 0.5) / 0.5
    np.testing.assert_array_equal(np.unique(together, axis=0), np.unique(expected, axis=0))
    labels = np.concatenate([y_train, y_eval])
    np.testing.assert_array_equal(np.bincount(labels), np.bincount(full.target))


def test_split_is_deterministic(splits: dict) -> None:
    """Two calls return identical arrays."""
    again = data.load()
    for name in ("train", "evaluation"):
        np.testing.assert_array_equal(splits[name][0], again[name][0])
        np.testing.assert_array_equal(splits[name][1], again[name][1])


def test_untrained_model_runs_and_exports(splits: dict) -> None:
    """The seeded untrained model runs and exports with a dynamic batch dimension."""
    net = model.build_untrained()
    x = torch.from_numpy(splits["evaluation"][0][:4])
    with torch.no_grad():
        logits = net(x)
    assert logits.shape == (4, 10)
    assert torch.equal(net.state_dict()["head.weight"], model.build_untrained().head.weight)
    exported = torch.export.export(
        net.eval(), (x,), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    x7 = torch.from_numpy(splits["evaluation"][0][:7])
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x7), net(x7))


def test_module_paths() -> None:
    """Module paths the specs and fault injection refer to exist."""
    names = dict(model.build_untrained().named_modules())
    for path in ("stem.conv", "block1.conv1", "block1.conv2", "widen.conv", "gate", "head"):
        assert path in names
    assert isinstance(names["head"], torch.nn.Linear) and names["head"].out_features == 10


def test_build_accuracy(trained: torch.nn.Module, splits: dict) -> None:
    """The trained model reaches >= 95% float top-1 on the evaluation split."""
    assert not trained.training
    x, y = splits["evaluation"]
    assert weights.accuracy(trained, x, y) >= 0.95


def test_direct_read_matches_sklearn_load_digits():
    """The split reads sklearn's bundled file itself; together it is exactly load_digits()."""

    bunch = load_digits()
    splits = data.load()
    x = np.concatenate([splits["train"][0], splits["evaluation"][0]]).reshape(len(bunch.target), -1)
    y = np.concatenate([splits["train"][1], splits["evaluation"][1]])
    ref = data._normalize(bunch.images).reshape(len(bunch.target), -1)
    order, ref_order = np.lexsort(np.c_[x, y].T), np.lexsort(np.c_[ref, bunch.target].T)
    assert np.array_equal(x[order], ref[ref_order]) and np.array_equal(
        y[order], bunch.target[ref_order]
    )
