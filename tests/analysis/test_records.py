"""Rows of the localization table (analysis/records.py), built from hand-made verdicts."""

from __future__ import annotations

from analysis.localize import PairVerdict
from analysis.own_error import OwnErrors
from analysis.records import localization_rows


def _verdict(base: str, analysis: str, reasons: list[str]) -> PairVerdict:
    own = OwnErrors(steps={"conv": 3.0 if reasons else 0.0}, reverted={}, exact=True)
    v = PairVerdict(base, analysis, reasons=reasons, own=own, tolerance=1.0)
    if reasons:
        v.first_layer, v.triage = "conv", "conv adds 3 steps of its own"
    return v


def test_a_passing_pair_between_two_failing_ones_leaves_one_rank_1_stage():
    verdicts = [
        _verdict("export", "convert", ["top-1 drops"]),
        _verdict("convert", "compile", []),
        _verdict("compile", "board_sim", ["output cosine"]),
    ]
    rows = localization_rows("r", verdicts, verdicts[0], {})
    stages = [(r["stage"], r["rank"]) for r in rows if r["kind"] == "stage"]
    assert stages == [("convert", 1), ("compile", 0), ("board_sim", 2)]
