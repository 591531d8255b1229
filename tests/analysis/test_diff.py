"""`qparity diff`: the run_diff_* golden answers and the console rendering."""

from __future__ import annotations

import pytest
import yaml
from rich.console import Console

from analysis.diff import SECTIONS, changed_rows, diff_runs, render_diff
from schemas.errors import QueryError
from schemas.store import RunStore
from schemas.table_schemas import SCHEMAS
from schemas.tables import write_rows
from tests.analysis.test_query import _loc, store  # noqa: F401  (the fixture)
from tests.conftest import tiny_spec_dict


def test_diff_runs_golden(store):  # noqa: F811
    root, (r1, r2, _) = store
    diff = diff_runs(root, r1, r2)
    assert list(diff) == list(SECTIONS)
    assert diff["run"].to_pylist() == [
        dict(section="run", key="code_version", a_value="0.1.0", b_value="0.2.0"),
        dict(section="settings", key="extra", a_value=None, b_value="1"),
        dict(section="settings", key="rounding", a_value="bpu_round", b_value="half_even"),
        dict(section="tags", key="t", a_value=None, b_value="x"),
    ]  # fmt: skip
    stages = diff["stages"].select(["stage", "same_artifact", "a_cache_hit", "b_cache_hit"])
    assert stages.to_pylist() == [
        dict(stage="qat", same_artifact=True, a_cache_hit=False, b_cache_hit=True),
        dict(stage="export", same_artifact=False, a_cache_hit=False, b_cache_hit=False),
    ]
    metrics = diff["metrics"]
    assert metrics.column("stage").to_pylist() == ["qat", "export", "convert"]
    assert metrics.column("changed").to_pylist() == [False, True, True]
    assert metrics.column("delta").to_pylist() == pytest.approx([0.0, -0.02, 0.02])
    loc = diff["localization"].select(["kind", "stage", "a_rank", "b_rank", "a_layer_id",
                                       "b_layer_id", "changed"])  # fmt: skip
    assert loc.to_pylist() == [  # paired by stage: r1 diverges at convert, r2 at export
        dict(kind="stage", stage="export", a_rank=None, b_rank=1, a_layer_id=None,
             b_layer_id=None, changed=True),
        dict(kind="stage", stage="convert", a_rank=1, b_rank=None, a_layer_id=None,
             b_layer_id=None, changed=True),
        dict(kind="layer", stage="export", a_rank=None, b_rank=1, a_layer_id=None,
             b_layer_id="add1", changed=True),
        dict(kind="layer", stage="convert", a_rank=1, b_rank=None, a_layer_id="conv2",
             b_layer_id=None, changed=True),
        dict(kind="layer", stage="convert", a_rank=2, b_rank=None, a_layer_id="add1",
             b_layer_id=None, changed=True),
        dict(kind="sensitive", stage="convert", a_rank=1, b_rank=None, a_layer_id="conv2",
             b_layer_id=None, changed=True),
        dict(kind="sensitive", stage="convert", a_rank=2, b_rank=None, a_layer_id="gemm",
             b_layer_id=None, changed=True),
    ]  # fmt: skip


def test_a_run_against_itself_has_no_difference(store):  # noqa: F811
    root, (r1, _, _) = store
    diff = diff_runs(root, r1, r1)
    assert diff["run"].num_rows == 0
    assert all(changed_rows(s, t).num_rows == 0 for s, t in diff.items())
    console = Console(record=True, width=120)
    console.print(render_diff(diff, r1, r1))
    assert console.export_text().count("no difference") == 4


def test_render_shows_changed_rows_only(store):  # noqa: F811
    root, (r1, r2, _) = store
    console = Console(record=True, width=200)
    console.print(render_diff(diff_runs(root, r1, r2), r1, r2))
    text = console.export_text()
    assert "half_even" in text and "code_version" in text
    # qat: a stages row (cache hit differs), but not a metrics row (equal top-1)
    assert text.count("│ qat ") == 1


def test_unknown_run_is_a_query_error(store):  # noqa: F811
    root, (r1, _, _) = store
    with pytest.raises(QueryError, match="no run 'nope' in the runs table.*Fix:"):
        diff_runs(root, r1, "nope")


def _run(runs: RunStore, spec: dict, digest: str, loc: list[tuple]) -> str:
    """A run of ``spec`` with a runs row and localization rows (kind, rank, stage, base,
    layer)."""
    run = runs.create_run("tiny", yaml.safe_dump(spec), digest, "0.1.0", {}, {})
    row = {name: None for name in SCHEMAS["runs"].names}
    row |= {"run_id": run.run_id, "spec_digest": digest, "settings": "{}", "tags": "{}"}
    write_rows(run, "runs", [row], "run")
    write_rows(run, "localization", [_loc(run.run_id, *r) for r in loc], "all")
    return run.run_id


def test_diff_shows_the_spec_fields_that_differ(tmp_path):
    runs = RunStore(tmp_path)
    a = _run(runs, tiny_spec_dict(), "a" * 64, [])
    spec_b = tiny_spec_dict(
        faults=[{"kind": "bias_drop", "layer": "conv"}], stages={"qat": {"enabled": True}}
    )
    spec_b["data"]["evaluation_samples"] = 32
    b = _run(runs, spec_b, "b" * 64, [])
    rows = {(r["section"], r["key"]): (r["a_value"], r["b_value"])
            for r in diff_runs(tmp_path, a, b)["run"].to_pylist()}  # fmt: skip
    assert rows[("spec", "data.evaluation_samples")] == ("64", "32")
    assert rows[("spec", "stages.qat.enabled")] == ("false", "true")
    assert rows[("spec", "faults[0].kind")] == (None, "bias_drop")
    assert rows[("spec", "faults[0].layer")] == (None, "conv")
    assert ("run", "spec_digest") in rows
    assert not [
        k for k in rows if k[0] == "spec" and not k[1].startswith(("data", "stages", "faults"))
    ]


def test_a_missing_spec_file_is_shown_not_left_out(tmp_path):
    """Was: every field of a's spec shown as a difference (b's side empty), with no word
    that b's spec.yaml is gone."""
    runs = RunStore(tmp_path)
    a = _run(runs, tiny_spec_dict(), "a" * 64, [])
    b = _run(runs, tiny_spec_dict(faults=[{"kind": "bias_drop", "layer": "conv"}]), "b" * 64, [])
    runs.open(b).path("spec.yaml").unlink()
    rows = {(r["section"], r["key"]): (r["a_value"], r["b_value"])
            for r in diff_runs(tmp_path, a, b)["run"].to_pylist()}  # fmt: skip
    assert [k for k in rows if k[0] == "spec"] == [("spec", "file")]
    assert rows[("spec", "file")] == ("read", "spec.yaml missing or unreadable")


def test_diff_pairs_localization_rows_by_stage(tmp_path):
    """a diverges at convert and again at board_sim, b only at convert; b ranks the
    sensitive ops the other way round."""
    runs = RunStore(tmp_path)
    stages = [("convert", "export"), ("compile", "convert"), ("board_sim", "compile")]
    ranks_a, ranks_b = (1, 0, 2), (1, 0, 0)
    loc_a = [("stage", r, s, base) for r, (s, base) in zip(ranks_a, stages, strict=True)]
    loc_b = [("stage", r, s, base) for r, (s, base) in zip(ranks_b, stages, strict=True)]
    loc_a += [
        ("sensitive", 1, "convert", "export", "conv"),
        ("sensitive", 2, "convert", "export", "head"),
    ]
    loc_b += [
        ("sensitive", 1, "convert", "export", "head"),
        ("sensitive", 2, "convert", "export", "conv"),
    ]
    a = _run(runs, tiny_spec_dict(), "a" * 64, loc_a)
    b = _run(runs, tiny_spec_dict(), "a" * 64, loc_b)
    got = diff_runs(tmp_path, a, b)["localization"].to_pylist()
    assert [(r["kind"], r["stage"], r["a_rank"], r["b_rank"], r["changed"]) for r in got] == [
        ("stage", "convert", 1, 1, False),
        ("stage", "compile", 0, 0, False),
        ("stage", "board_sim", 2, 0, True),
        ("sensitive", "convert", 1, 2, True),
        ("sensitive", "convert", 2, 1, True),
    ]
    assert [(r["a_layer_id"], r["b_layer_id"]) for r in got[3:]] == [
        ("conv", "conv"),
        ("head", "head"),
    ]


def test_a_ptq_run_lines_up_with_a_qat_run_stage_by_stage(store):  # noqa: F811
    """quantized is paired with convert, hbm with compile (chain.step); the rows name both."""
    from tests.analysis.test_query import _metric, _run

    root, (r1, _, _) = store
    ptq = _run(RunStore(root), "2026-01-03T00:00:00", "m", {"chain": "ptq"})
    for stage, value in (("calibrated", 0.9), ("quantized", 0.84), ("hbm", 0.84)):
        _metric(ptq, stage, value)
    rows = diff_runs(root, r1, ptq.run_id)["metrics"].to_pylist()
    paired = {r["stage"]: (r["a_stage"], r["b_stage"], r["delta"]) for r in rows}
    assert paired["convert"] == ("convert", "quantized", pytest.approx(-0.01))
    assert paired["compile"] == (None, "hbm", None)  # r1 has no compile metric
    assert paired["export"][1] is None and paired["calibrate"] == (None, "calibrated", None)


def test_a_diff_reads_only_its_two_runs(store):  # noqa: F811
    import warnings

    import pyarrow.parquet as pq

    root, (r1, r2, r3) = store
    other = RunStore(root).open(r3)
    row = {"run_id": r3, "stage": "qat", "metric": "top1", "value": 0.5, "n_samples": 8,
           "output": "y"}  # fmt: skip
    part = write_rows(other, "metrics", [row], "qat")
    pq.write_table(pq.read_table(part).slice(0, 0), part)  # r3's part fails its digest
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # r3 is neither hashed nor read
        diff = diff_runs(root, r1, r2)
    assert {r["a_value"] for r in diff["metrics"].to_pylist()} == {0.9, 0.85}
