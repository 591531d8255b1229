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
    own = OwnErrors(steps={"conv": 3.0 if reasons else 0.0}, parts={}, exact=True)
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


def test_layer_tensors_are_one_part_per_sample_and_side_and_a_rerun_replaces_them(make_ctx):
    """Memory holds one sample's layers (a 224x224 network's are 50-150 MB); the parts of an
    earlier analysis of the run, whatever their names, are replaced, never added to."""
    from types import SimpleNamespace

    from analysis.records import write_tensors
    from schemas.tables import read_run_table, write_columns

    ctx = make_ctx(compare={"probe_samples": 2})
    seen = []

    def run(idx, replace=None):
        seen.append(len(idx))
        return None, {"conv": np.full((len(idx), 2, 3), float(idx[0]), np.float32)}

    models = {s: SimpleNamespace(run=run) for s in ("convert", "compile")}
    result = SimpleNamespace(base="convert", analysis="compile", layer_ids=["conv"],
                             steps={"conv": 0.5})  # fmt: skip
    first = SimpleNamespace(base="convert", analysis="compile", samples=[7])
    old = {"run_id": [ctx.run.run_id], "base_stage": ["a"], "analysis_stage": ["b"],
           "layer_id": ["x"], "sample_id": [0], "reason": ["probe"], "side": ["base"],
           "shape": [[1]], "scale": [1.0], "values": float32_lists([np.zeros(1)])}  # fmt: skip
    write_columns(ctx.run, "layer_tensors", old, "all")  # an earlier analysis' single part
    for _ in range(2):
        write_tensors(ctx, models, {("convert", "compile"): result}, first, {})
    rows = read_run_table(ctx.run, "layer_tensors")
    assert sorted((r["reason"], r["side"], r["sample_id"]) for r in rows) == sorted(
        (reason, side, s) for reason, ids in (("probe", [0, 1]), ("badcase", [7]))
        for side in ("base", "analysis") for s in ids
    )  # fmt: skip
    assert all(r["values"] == [float(r["sample_id"])] * 6 and r["shape"] == [2, 3] for r in rows)
    assert set(seen) == {1}
