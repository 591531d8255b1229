"""Triage of a divergent pair: own errors first; an input or the output blamed only when it
is compared and off itself (#22 item 20)."""

from __future__ import annotations

from analysis.compare import OUTPUT, PairResult
from analysis.localize import PairVerdict
from analysis.own_error import OwnErrors
from analysis.triage import triage

LAYERS = ["input:x", "conv", "relu", "head"]
DTYPES = {"input:x": "int8", "conv": "int8", "relu": "int8", "head": "int32"}


def _triage(total: dict[str, float], own: dict[str, float], first: str, exact=True,
            ids=LAYERS) -> str:  # fmt: skip
    """The triage of a convert pair whose layers (``ids``) and output have these total and
    own errors (steps)."""
    result = PairResult("export", "convert", layer_ids=ids)
    result.aggregates = {lid: {"max_qscale_diff": total.get(lid, 0.0)} for lid in [*ids, OUTPUT]}
    steps = {lid: own.get(lid, 0.0) for lid in ids if not lid.startswith("input:")}
    v = PairVerdict("export", "convert", reasons=["x"], tolerance=1.0, first_layer=first)
    v.own = OwnErrors(steps, {}, exact)
    return triage(result, v, DTYPES)


def test_triage_blames_a_first_layer_that_adds_error_of_its_own():
    got = _triage({"conv": 19, "relu": 19, "head": 9e3}, {"conv": 19}, "conv")
    assert "stage/op problem at conv" in got and "input" not in got


def test_triage_blames_an_output_layer_that_adds_error_of_its_own():
    got = _triage({"head": 2e4}, {"head": 2e4}, "head")
    assert "stage/op problem at head" in got and "post-processing" not in got


def test_triage_sends_inherited_errors_to_the_input():
    assert "check the input data" in _triage({"input:x": 3, "conv": 5}, {}, "conv")


def test_triage_never_blames_an_input_that_compares_equal():
    """The first layer is off in total (on samples other than the judged ones: its own
    error there is 0.5 step) while its input is compared and not off: the error is the
    layer's, not the input's."""
    got = _triage({"conv": 5, "relu": 5}, {"conv": 0.5}, "conv")
    assert "stage/op problem at conv" in got and "input" not in got


def test_triage_without_a_compared_input_names_both_suspects():
    got = _triage({"conv": 5, "relu": 5}, {"conv": 0.5}, "conv", ids=LAYERS[1:])
    assert "the input is not compared" in got and "preprocessing" in got and "conv" in got


def test_triage_sends_only_an_output_off_to_post_processing():
    assert "post-processing" in _triage({OUTPUT: 3}, {"relu": 0.5}, "relu")
    got = _triage({}, {"relu": 0.5}, "relu")  # e.g. a top-1 drop from near-ties
    assert "post-processing" not in got and "add up" in got and "relu" in got


def test_triage_without_exact_own_errors_names_the_first_layer_off():
    got = _triage({"relu": 4, "head": 9e3}, {"relu": 4, "head": 9e3}, "relu", exact=False)
    assert got.startswith("relu is the first layer off")
