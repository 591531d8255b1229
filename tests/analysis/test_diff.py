"""`qparity diff`: the run_diff_* golden answers and the console rendering."""

from __future__ import annotations

import pytest
from rich.console import Console

from analysis.diff import SECTIONS, changed_rows, diff_runs, render_diff
from schemas.errors import QueryError
from tests.analysis.test_query import store  # noqa: F401  (the fixture)


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
    loc = diff["localization"].select(["kind", "rank", "a_layer_id", "b_layer_id", "changed"])
    assert loc.to_pylist() == [
        dict(kind="stage", rank=1, a_layer_id=None, b_layer_id=None, changed=True),
        dict(kind="layer", rank=1, a_layer_id="conv2", b_layer_id="add1", changed=True),
        dict(kind="layer", rank=2, a_layer_id="add1", b_layer_id=None, changed=True),
        dict(kind="sensitive", rank=1, a_layer_id="conv2", b_layer_id=None, changed=True),
        dict(kind="sensitive", rank=2, a_layer_id="gemm", b_layer_id=None, changed=True),
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
