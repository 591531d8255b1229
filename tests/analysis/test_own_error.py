"""Own errors and sensitivity streamed over chunks of samples give what one run gives."""

import numpy as np
import pytest

from analysis import own_error
from analysis.own_error import own_errors, sensitivity
from stages.stage_models import StageModel

X = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)


def _model(stage: str, step: float | None) -> StageModel:
    """x -> "a" = 2x -> "b" = 1.3 a + 1 -> output b * 3, each layer rounded to ``step``
    (None: float); ``replace`` substitutes a layer's value downstream while its captured
    value is what it computed (the StageModel contract)."""

    def q(v):
        return v if step is None else np.round(v / step) * step

    def run(idx, replace=None):
        replace = replace or {}
        a = q(2 * X[idx])
        b = q(1.3 * replace.get("a", a) + 1)
        return 3 * replace.get("b", b), {"a": a, "b": b}

    return StageModel(stage, run)


def _judge(chunk: int, monkeypatch):
    monkeypatch.setattr(own_error, "CHUNK", chunk)
    base, ana = _model("float", None), _model("quant", 0.25)
    idx = np.arange(len(X))
    own = own_errors(base, ana, idx, ["a", "b"], {"a": 0.25, "b": 0.25})
    rows = sensitivity(base, ana, idx, own, ["a", "b"])
    return own, rows


def test_chunked_judging_equals_one_run(monkeypatch):
    whole, whole_rows = _judge(100, monkeypatch)
    for chunk in (1, 2, 3):
        own, rows = _judge(chunk, monkeypatch)
        assert own.steps == pytest.approx(whole.steps)
        assert own.cosine == pytest.approx(whole.cosine, rel=1e-12)
        assert [r[0] for r in rows] == [r[0] for r in whole_rows]
        flat = [v for r in rows for v in r[1:]]
        assert flat == pytest.approx([v for r in whole_rows for v in r[1:]], rel=1e-12)
        for lid, v in whole.reverted.items():
            np.testing.assert_array_equal(own.reverted[lid], v)
    assert set(whole.reverted) == {"a", "b"} and whole.reverted["a"].shape == X.shape


def test_own_error_is_the_layers_own_rounding(monkeypatch):
    """Each layer's own error is its own rounding (at most half a step); reverting either
    brings the output closer to the float model's."""
    own, rows = _judge(2, monkeypatch)
    assert 0 < own.steps["b"] <= 0.5 and 0 < own.steps["a"] <= 0.5
    assert all(after < before for _, before, after in rows)
