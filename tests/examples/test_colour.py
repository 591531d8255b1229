"""Tests for the colour example: the dataset, the two models, and the RGB-vs-nv12 divergence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from examples import weights
from examples.colour import data, model
from schemas.spec import load_spec
from simulator.arith import board_input as bi

SPEC = Path(data.__file__).with_name("spec.yaml")


@pytest.fixture(scope="module")
def rgb_split() -> dict:
    """The RGB-format splits, loaded once."""
    return data.load("rgb")


@pytest.fixture(scope="module")
def yuv_split() -> dict:
    """The YUV444-format splits, loaded once."""
    return data.load("yuv444")


@pytest.fixture(scope="module")
def models() -> dict:
    """Both trained models (each trains once on a cache miss)."""
    return {"rgb": model.build_rgb(), "yuv444": model.build_yuv444()}


def board_inputs(training_format: str, runtime_format: str = "nv12") -> np.ndarray:
    """The evaluation frames as the board feeds them to a model trained on ``training_format``
    (camera rgb -> yuv -> nv12 or yuv444 -> preprocess), de-normalized to that format."""
    frames = data.camera_frames("evaluation")
    yuv = bi.rgb_to_yuv(frames, "bt601_full")
    x = bi.to_nv12(yuv) if runtime_format == "nv12" else yuv
    attrs = {"runtime_format": runtime_format, "training_format": training_format}
    q = bi.preprocess(x, attrs).astype(np.float32)
    weight, bias = bi.fold_mean_std(
        *((127.5, 127.5) if training_format == "rgb" else (128, 128)), 1.0
    )
    f = q * weight[:, 0, 0, 0] + bias
    return np.ascontiguousarray(f.transpose(0, 3, 1, 2))


@pytest.fixture(scope="module")
def top1(models: dict, rgb_split: dict, yuv_split: dict) -> dict:
    """Top-1 of each model on its own evaluation set and on the board's camera paths."""
    y = data.labels("evaluation")
    acc = model.accuracy
    return {
        "rgb/own": acc(models["rgb"], rgb_split["evaluation"][0], y),
        "rgb/nv12": acc(models["rgb"], board_inputs("rgb"), y),
        "rgb/yuv444": acc(models["rgb"], board_inputs("rgb", "yuv444"), y),
        "yuv444/own": acc(models["yuv444"], yuv_split["evaluation"][0], y),
        "yuv444/nv12": acc(models["yuv444"], board_inputs("yuv444"), y),
        "yuv444/yuv444": acc(models["yuv444"], board_inputs("yuv444", "yuv444"), y),
    }


def test_splits_shapes_dtypes_labels(rgb_split: dict, yuv_split: dict) -> None:
    """3188 train / 1000 evaluation float32 (N, 3, 16, 16) frames, labels 0..19, kinds halved."""
    for split in (rgb_split, yuv_split):
        assert split["train"][0].shape == (3188, 3, 16, 16)
        assert split["evaluation"][0].shape == (1000, 3, 16, 16)
        for x, y in (split["train"], split["evaluation"]):
            assert x.dtype == np.float32 and y.dtype == np.int64
            assert set(np.unique(y)) == set(range(20))
            assert x.min() >= -1.0 and x.max() <= 1.0
    np.testing.assert_array_equal(rgb_split["evaluation"][1], yuv_split["evaluation"][1])
    np.testing.assert_array_equal(rgb_split["camera_evaluation"], data.camera_frames("evaluation"))
    assert np.sum(rgb_split["evaluation"][1] >= 10) == 500


def test_loaders_are_deterministic_and_factories_match(rgb_split: dict) -> None:
    """Two calls give identical arrays; load_rgb() is load("rgb")."""
    again = data.load_rgb()
    for name in ("train", "evaluation"):
        np.testing.assert_array_equal(rgb_split[name][0], again[name][0])
        np.testing.assert_array_equal(rgb_split[name][1], again[name][1])
    with pytest.raises(ValueError, match="unknown training format"):
        data.load("hsv")


def test_rgb_format_is_the_frames_in_minus_one_one(rgb_split: dict) -> None:
    """load("rgb") is (frame / 255 - 0.5) / 0.5 of camera_frames, NCHW."""
    frames = data.camera_frames("evaluation")
    assert frames.dtype == np.uint8 and frames.shape == (1000, 16, 16, 3)
    expected = (frames.astype(np.float32) / 255 - 0.5) / 0.5
    np.testing.assert_allclose(rgb_split["evaluation"][0], expected.transpose(0, 3, 1, 2))


def test_yuv444_format_is_the_board_camera_path(yuv_split: dict) -> None:
    """load("yuv444") is (nearest(nv12(rgb_to_yuv(frames))) - 128) / 128, NCHW."""
    frames = data.camera_frames("evaluation")
    y, uv = bi.to_nv12(bi.rgb_to_yuv(frames, "bt601_full"))
    expected = (bi.nv12_to_yuv444(y, uv).astype(np.float32) - 128) / 128
    np.testing.assert_array_equal(yuv_split["evaluation"][0], expected.transpose(0, 3, 1, 2))


def test_class_lives_in_the_chroma_mosaic() -> None:
    """The top-left chroma of each 2x2 stroke cell is the opposite hue of the other three,
    and kind 0 has a warm (V > 128) top-left, kind 1 a cool one."""
    frames, labels = data.camera_frames("evaluation"), data.labels("evaluation")
    yuv = bi.rgb_to_yuv(frames).astype(int)
    stroke = yuv[:, ::2, ::2, 0] > 100
    top_left_v = np.where(stroke, yuv[:, ::2, ::2, 2] - 128, 0).sum((1, 2))
    other_v = np.where(stroke, yuv[:, 1::2, 1::2, 2] - 128, 0).sum((1, 2))
    kind = labels // 10
    assert np.all((top_left_v > 0) == (kind == 0))
    assert np.all((other_v > 0) == (kind == 1))


def test_models_reach_top1_on_their_own_format(top1: dict) -> None:
    """Float top-1 >= 0.9 for each model on its own training format's evaluation set."""
    assert top1["rgb/own"] >= 0.9
    assert top1["yuv444/own"] >= 0.9


def test_rgb_model_breaks_on_nv12_but_not_on_yuv444(top1: dict) -> None:
    """RGB-trained model through the board's nv12 path (rgb -> nv12 -> yuv444 -> rgb) loses
    >= 10 points; through yuv444 (no subsampling, only the colour-matrix rounding) < 2."""
    assert top1["rgb/own"] - top1["rgb/nv12"] >= 0.10
    assert abs(top1["rgb/own"] - top1["rgb/yuv444"]) < 0.02


def test_yuv444_model_survives_the_nv12_path(top1: dict) -> None:
    """The model trained on what the board sees loses < 2 points on the same nv12 path,
    against its own evaluation and against the RGB model's RGB top-1."""
    assert top1["yuv444/own"] - top1["yuv444/nv12"] < 0.02
    assert top1["rgb/own"] - top1["yuv444/nv12"] < 0.02


def test_yuv444_model_trained_on_nv12_breaks_on_full_chroma(top1: dict) -> None:
    """The mirror image: trained on the nv12 path, fed full-chroma yuv444 frames, it loses
    >= 10 points too (the training path must match the runtime path, not just "YUV")."""
    assert top1["yuv444/own"] - top1["yuv444/yuv444"] >= 0.10


def test_weights_are_cached_per_format(models: dict) -> None:
    """Each format has its own cache file (format in the name and key), loaded without pickle
    (from the cache, else from the shipped copy of the same name)."""
    rgb_path, yuv_path = model.cache_path("rgb"), model.cache_path("yuv444")
    assert rgb_path != yuv_path and model.cache_key("rgb") != model.cache_key("yuv444")
    assert "rgb" in rgb_path.name and "yuv444" in yuv_path.name
    for fmt, path in (("rgb", rgb_path), ("yuv444", yuv_path)):
        path = path if path.exists() else weights.SHIPPED / path.name
        state = load_file(path)
        for key, value in models[fmt].state_dict().items():
            assert torch.equal(state[key], value)
    with pytest.raises(ValueError):
        model.cache_path("nv12")


def test_training_is_deterministic(tmp_path, monkeypatch) -> None:
    """Two retrainings in fresh cache folders, nothing shipped, give bit-identical weights.

    Against each other, not against the shipped file: torch's float kernels sum in another
    order on another instruction set (the shipped weights were trained on an AVX2 host and
    an AVX-512 host retrains them a few ulps apart), which is why the trained files ship."""
    monkeypatch.setattr(weights, "SHIPPED", tmp_path / "nothing-shipped")
    first = model.build_rgb(cache_dir=tmp_path / "first")
    again = model.build_rgb(cache_dir=tmp_path / "again")
    for key, value in first.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_untrained_model_and_module_paths() -> None:
    """The seeded untrained model maps (N, 3, 16, 16) to 20 logits; module paths exist."""
    net = model.build_untrained()
    with torch.no_grad():
        assert net(torch.zeros(2, 3, 16, 16)).shape == (2, 20)
    names = dict(net.named_modules())
    for path in ("stem.conv", "stem.bn", "body.conv", "pool", "head"):
        assert path in names


def test_spec_loads() -> None:
    """The bundled spec is valid and describes the RGB-trained model."""
    spec = load_spec(SPEC)
    assert spec.data.input_format == "rgb"
    assert spec.model.factory == "examples.colour.model:build_rgb"
    assert spec.data.dataset == "examples.colour.data:load_rgb"
    assert spec.data.mean == [127.5] * 3 and spec.data.std == [127.5] * 3
