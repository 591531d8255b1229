"""Range flags: outlier ranges, lost bulk (the mask add), residual adds named by origin."""

from __future__ import annotations

import numpy as np

from analysis.layer_graph import Layer
from analysis.range_flags import OUTLIER_RATIO, range_flags, stream_origin

LAYERS = {
    "emb.add": Layer("emb.add", "add", 0, ("input:x", "emb.pos")),
    "ln0": Layer("ln0", "layer_norm", 1, ("emb.add",)),
    "dense": Layer("dense", "linear", 2, ("ln0",)),
    "res": Layer("res", "add", 3, ("dense", "ln0")),
    "scores": Layer("scores", "matmul", 4, ("res",)),
    "mask": Layer("mask", "add", 5, ("scores",)),
    "probs": Layer("probs", "softmax", 6, ("mask",)),
    "emb.pos": Layer("emb.pos", "embedding", -1, ()),
}


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    normal = rng.standard_normal((4, 16, 384))
    outliers = normal.copy()
    outliers[..., :2] *= 100.0  # two outlier dimensions, 0.5% of the values
    masked = rng.standard_normal((4, 16, 16))
    masked[..., 12:] = -10000.0  # a quarter of the keys padded
    probs = np.zeros((4, 16, 16))
    probs[..., 0] = 1.0
    return {"emb.add": normal, "ln0": normal, "dense": normal, "res": outliers,
            "scores": masked[..., :12], "mask": masked, "probs": probs}  # fmt: skip


def _scales(values) -> dict[str, float]:
    return {k: float(np.abs(v).max()) / 127 for k, v in values.items()}


def test_flags_the_outlier_residual_add_and_the_mask_add_only():
    values = _values()
    flags = {f.layer_id: f for f in range_flags(values, LAYERS, _scales(values),
                                                dict.fromkeys(values, "int8"))}  # fmt: skip
    assert set(flags) == {"res", "mask"}  # gaussian layers and the softmax are not flagged
    res = flags["res"]
    assert res.kind == "residual add" and res.stream_from == "emb.add"  # through ln0
    assert res.ratio > OUTLIER_RATIO and res.max_abs > 200
    info = res.info()
    assert "stream from emb.add" in info and "p99" in info and "int8 scale" in info
    assert flags["mask"].kind == "mask add" and flags["mask"].lost_bulk
    assert "< 0.5" in flags["mask"].info()


def test_int16_layers_are_not_flagged():
    values = _values()
    dtypes = dict.fromkeys(values, "int8") | {"res": "int16", "mask": "int16"}
    assert range_flags(values, LAYERS, _scales(values), dtypes) == []


def test_stream_origin_passes_norms_only():
    assert stream_origin("ln0", LAYERS) == "emb.add"
    assert stream_origin("dense", LAYERS) is None  # a linear is not the stream


def test_an_add_of_a_mask_built_from_the_tokenizers_mask_is_a_mask_add():
    """BERT's ``(1 - attention_mask) * -10000`` is a layer (computed from an input), not a
    constant: its values (all <= 0, reaching -1e4) make the add a mask add."""
    layers = dict(LAYERS) | {
        "ext": Layer("ext", "mul", 4, ("input:attention_mask",)),
        "mask": Layer("mask", "add", 5, ("scores", "ext")),
    }
    values = _values()
    values["ext"] = np.where(np.arange(16) < 12, 0.0, -10000.0) * np.ones((4, 1, 16))
    flags = {f.layer_id: f for f in range_flags(values, layers, _scales(values),
                                                dict.fromkeys(values, "int8"))}  # fmt: skip
    assert flags["mask"].kind == "mask add"
    values["ext"] = -values["ext"]  # a positive operand is no mask
    flags = {f.layer_id: f for f in range_flags(values, layers, _scales(values),
                                                dict.fromkeys(values, "int8"))}  # fmt: skip
    assert flags["mask"].kind == "add"
