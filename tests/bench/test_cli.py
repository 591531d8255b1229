"""bench/cli.py's store of clones: each clone a distinct, verifiable run."""

from __future__ import annotations

import warnings

from analysis.query import run_sql
from bench.cli import make_store
from schemas.store import RunStore
from schemas.tables import write_rows


def test_clones_are_distinct_runs_whose_tables_verify(tmp_path):
    run = RunStore(tmp_path / "src").create_run("tiny", "", "ab" * 32, "0.1.0", {}, {})
    row = {"run_id": run.run_id, "stage": "qat", "metric": "top1", "value": 0.5,
           "n_samples": 8, "output": "y"}  # fmt: skip
    write_rows(run, "metrics", [row], "qat")
    make_store(tmp_path / "many", tmp_path / "src", 3)
    ids = {m.run_id for m in RunStore(tmp_path / "many").list_runs()}
    assert len(ids) == 3 and run.run_id not in ids
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a part failing its digest would warn
        rows = run_sql(tmp_path / "many", "SELECT run_id FROM metrics").to_pylist()
    assert {r["run_id"] for r in rows} == ids
