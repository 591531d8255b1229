"""The crash bench's store check on tiny hand-made stores (no chain runs): what a killed
run may not leave behind once the rerun ended."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from bench.crash import check_store
from schemas.store import RunStore
from schemas.tables import write_rows


def _runs_row(run, status: str) -> None:
    m = run.manifest()
    row = {
        "run_id": run.run_id, "started_at": m.started_at, "finished_at": None,
        "status": status, "spec_digest": m.spec_digest, "model": None, "march": None,
        "consistency_level": None, "settings": None, "code_version": m.code_version,
        "tags": "{}",
    }  # fmt: skip
    write_rows(run, "runs", [row], part="run")


def _store(tmp_path):
    store = RunStore(tmp_path / "runs")
    return store, store.create_run("tiny", "", "ab" * 32, "0.1.0", {}, {})


def test_a_run_still_marked_running_is_a_finding(tmp_path):
    store, run = _store(tmp_path)
    _runs_row(run, "running")
    assert check_store(store.root) == [f"{run.run_id}: still marked running after the rerun"]


def test_a_runs_row_that_disagrees_with_its_manifest_is_a_finding(tmp_path):
    store, run = _store(tmp_path)
    _runs_row(run, "running")
    run.finish("complete")
    assert check_store(store.root) == [
        f"{run.run_id}: runs row says running, its manifest complete"
    ]


def test_a_table_part_failing_its_digest_is_a_finding_not_a_crash(tmp_path):
    store, run = _store(tmp_path)
    _runs_row(run, "complete")
    run.finish("complete")
    part = run.path("tables/runs/run.parquet")
    rows = pq.read_table(part).to_pylist()
    rows[0]["status"] = "failed"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(part)), part)
    (problem,) = check_store(store.root)
    assert problem.startswith("table runs:") and "run.parquet" in problem
