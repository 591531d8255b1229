"""The localization summary names the output the stages were judged on."""

from __future__ import annotations

from types import SimpleNamespace

from analysis.analyze import Analysis


def _verdict(**kw):
    own = SimpleNamespace(steps={"conv": 3.0}, cosine={"conv": 0.9})
    base = dict(base="export", analysis="convert", reasons=["cosine on output.2 drops 0.1"],
                sensitive=[("conv", 1.0)], first_layer="conv", own=own, quantization=False,
                triage="convert")  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_a_divergent_stage_and_the_judged_output():
    v = _verdict()
    text = Analysis("r", ["export", "convert"], [v], v, [], "cosine of output.2").summary()
    assert "first divergent stage convert (vs export)" in text
    assert "judged by: cosine of output.2" in text.splitlines()[1]


def test_no_divergent_stage_and_the_judged_output():
    v = _verdict()
    text = Analysis("r", ["export", "convert"], [v], None, [], "top-1 of output.1").summary()
    assert text == ("run r: no stage diverges (export->convert within thresholds; judged by "
                    "top-1 of output.1)")  # fmt: skip
