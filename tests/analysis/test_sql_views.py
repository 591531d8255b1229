"""The SQL session's runs view agrees with ``qparity runs`` on killed runs."""

from __future__ import annotations

from analysis import sql_views
from analysis.query import run_sql
from schemas.store import RunStore


def test_a_killed_run_without_its_runs_row_reads_interrupted(tmp_path, monkeypatch):
    run = RunStore(tmp_path).create_run("tiny", "", "ab" * 32, "0.1.0", {}, {})
    monkeypatch.setattr(sql_views, "died", lambda m: m.status == "running")  # owner gone
    rows = run_sql(tmp_path, "SELECT run_id, status, finished_at FROM runs").to_pylist()
    assert rows == [
        {"run_id": run.run_id, "status": "interrupted", "finished_at": rows[0]["finished_at"]}
    ]
    assert rows[0]["finished_at"] is not None
