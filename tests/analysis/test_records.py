"""Rows of the localization table (analysis/records.py), built from hand-made verdicts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from analysis.localize import PairVerdict
from analysis.own_error import OwnErrors
from analysis.records import localization_rows
from schemas.tables import float32_lists


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


@pytest.mark.parametrize("shapes", [[], [(3,)], [(2, 3), (0,), (1, 4, 2)]])
def test_float32_lists_equal_the_row_by_row_arrow_lists(shapes):
    rng = np.random.default_rng(0)
    tensors = [rng.normal(size=s) for s in shapes]
    got = float32_lists(tensors)
    slow = pa.array([[float(np.float32(v)) for v in t.reshape(-1)] for t in tensors],
                    type=pa.list_(pa.float32()))  # fmt: skip
    assert got.type == pa.list_(pa.float32())
    assert got.to_pylist() == slow.to_pylist()
