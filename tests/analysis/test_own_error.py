"""Own errors and sensitivity streamed over chunks of samples give what one run gives."""

import numpy as np
import pytest

from analysis import own_error
from analysis.own_error import own_errors, sensitivity
from analysis.quant_parts import parts_from_sums, quantization_parts
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
    rows = sensitivity(base, ana, idx, own, ["a", "b"], quant_steps=STEPS)
    return own, rows


STEPS = {"a": 0.25, "b": 0.25}


def test_chunked_judging_equals_one_run(monkeypatch):
    whole, whole_rows = _judge(100, monkeypatch)
    for chunk in (1, 2, 3):
        own, rows = _judge(chunk, monkeypatch)
        assert own.steps == pytest.approx(whole.steps)
        assert own.cosine == pytest.approx(whole.cosine, rel=1e-12)
        assert [r[0] for r in rows] == [r[0] for r in whole_rows]
        flat = [v for r in rows for v in r[1:]]
        assert flat == pytest.approx([v for r in whole_rows for v in r[1:]], rel=1e-12)
        for lid, sums in whole.parts.items():
            for dtype, v in sums.items():
                np.testing.assert_allclose(own.parts[lid][dtype], v, rtol=1e-12)
    assert set(whole.parts) == {"a", "b"} and whole.parts["a"][None][2] == X.size


def test_streamed_parts_equal_the_split_of_the_whole_reverted_tensors(monkeypatch):
    """The weight/activation split from sums streamed over chunks equals
    quantization_parts on the whole tensors: the analysis layer, and the float layer
    computed on the quantized inputs (the float model fed the quantized "a")."""
    own, _ = _judge(2, monkeypatch)
    ana_a = np.round(2 * X / 0.25) * 0.25
    ana_b = np.round((1.3 * ana_a + 1) / 0.25) * 0.25
    reverted = {"a": 2 * X, "b": 1.3 * ana_a + 1}  # base layers on the analysis inputs
    for lid, value in (("a", ana_a), ("b", ana_b)):
        for dtype in ("int8", "int16", "int32", None):
            got = parts_from_sums(own.parts[lid], STEPS[lid], dtype)
            want = quantization_parts(value, reverted[lid], STEPS[lid], dtype)
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_own_error_is_the_layers_own_rounding(monkeypatch):
    """Each layer's own error is its own rounding (at most half a step); reverting either
    brings the output closer to the float model's."""
    own, rows = _judge(2, monkeypatch)
    assert 0 < own.steps["b"] <= 0.5 and 0 < own.steps["a"] <= 0.5
    assert all(after < before for _, before, after in rows)


def test_each_candidates_reverted_runs_follow_each_other(monkeypatch):
    """Sensitivity reverts one candidate over every chunk before the next: a graph
    runner builds the cut graph of a candidate once (stages.onnx_runner.CUT_RUNNERS is 1),
    not once per chunk. The rows are those of one whole run."""
    monkeypatch.setattr(own_error, "CHUNK", 2)
    base, quant = _model("float", None), _model("quant", 0.25)
    fed: list[tuple[str, ...]] = []

    def run(idx, replace=None):
        if replace:
            fed.append(tuple(replace))
        return quant.runner(idx, replace)

    ana = StageModel("quant", run)
    idx = np.arange(len(X))
    own = own_errors(base, ana, idx, ["a", "b"], STEPS)
    rows = sensitivity(base, ana, idx, own, ["a", "b"], quant_steps=STEPS)
    assert fed == [("a",)] * 4 + [("b",)] * 4  # 7 samples, chunks of 2
    _, whole = _judge(100, monkeypatch)
    assert [r[0] for r in rows] == [r[0] for r in whole]
    assert [v for r in rows for v in r[1:]] == pytest.approx(
        [v for r in whole for v in r[1:]], rel=1e-12
    )
