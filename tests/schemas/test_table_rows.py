"""A run's table rows come from DuckDB parsing the very bytes that were verified: the same
rows pyarrow's reader gives, columns cast to their declared types, a part without a
required column refused naming it."""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import table_rows
from schemas.errors import ArtifactError
from schemas.store import RunStore
from schemas.table_digests import write_part
from schemas.table_rows import read_run_table
from schemas.tables import read_run_arrow, write_rows


@pytest.fixture
def run(tmp_path):
    run = RunStore(tmp_path).create_run("demo", "", "ab" * 32, "0.1.0", {}, {})
    rows = [{"run_id": run.run_id, "stage": s, "metric": "top1", "value": v, "n_samples": 10,
             "output": o} for s, v, o in (("qat", 0.5, "y"), ("convert", float("nan"), None))]  # fmt: skip
    write_rows(run, "metrics", rows, "qat")
    started = datetime(2026, 1, 1, 12, 30, 1, 250, tzinfo=UTC)
    stage = {"run_id": run.run_id, "stage": "qat", "status": "complete", "started_at": started,
             "finished_at": None, "duration_s": 1.5, "artifact_digest": "d" * 64, "cache_hit": True}  # fmt: skip
    write_rows(run, "stages", [stage], "qat")
    tensor = {"run_id": run.run_id, "base_stage": "qat", "analysis_stage": "convert",
              "layer_id": "conv1", "sample_id": 0, "reason": "probe", "side": "base",
              "shape": [1, 2], "scale": None, "values": [0.1, -2.5]}  # fmt: skip
    write_rows(run, "layer_tensors", [tensor], "probe")
    return run


def _write_part(run, rel: str, data: pa.Table) -> None:
    """A part recorded in the manifest as the run's own, written as given."""
    write_part(run, rel, lambda tmp: pq.write_table(data, str(tmp)))


@pytest.mark.parametrize("table", ["metrics", "stages", "layer_tensors", "faults"])
def test_rows_are_the_rows_pyarrow_reads(run, table):
    arrow = read_run_arrow(run, table)
    want = [] if arrow is None else arrow.to_pylist()
    assert _nan_free(read_run_table(run, table)) == _nan_free(want)


def _nan_free(rows: list[dict]) -> list[dict]:
    """``rows`` with each NaN as the string "NaN" (NaN is not equal to itself)."""
    return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in rows]  # fmt: skip


def test_an_older_part_and_an_extra_column_read_as_pyarrow_reads_them(run):
    older = pa.table({"run_id": [run.run_id], "stage": ["export"], "metric": ["top1"],
                      "value": pa.array([1], pa.int32()), "extra": ["x"]})  # fmt: skip
    _write_part(run, "tables/metrics/old.parquet", older)
    rows = read_run_table(run, "metrics")
    assert _nan_free(rows) == _nan_free(read_run_arrow(run, "metrics").to_pylist())
    assert rows[0] == {"run_id": run.run_id, "stage": "export", "metric": "top1", "value": 1.0,
                       "extra": "x", "n_samples": None, "output": None}  # fmt: skip
    assert isinstance(rows[0]["value"], float)  # cast to the declared DOUBLE


def test_a_part_without_a_required_column_is_refused_naming_it(run):
    _write_part(run, "tables/metrics/bad.parquet", pa.table({"run_id": [run.run_id]}))
    with pytest.raises(ArtifactError, match="required column stage is missing") as info:
        read_run_table(run, "metrics")
    assert str(run.path("tables/metrics/bad.parquet")) in info.value.message


def test_duckdb_parses_the_verified_bytes_not_the_path_again(run, monkeypatch):
    """A part rewritten between the digest check and the parse: the verified rows are read."""
    check = table_rows.check_table

    def check_then_rewrite(root, table, digest_of):
        files = check(root, table, digest_of)
        for f in files:  # a valid part with other values, after the check
            pq.write_table(pq.read_table(f).slice(0, 1).drop_columns(["value"]), f)
        return files

    monkeypatch.setattr(table_rows, "check_table", check_then_rewrite)
    assert [r["value"] for r in read_run_table(run, "metrics")][0] == 0.5


def test_without_memfd_a_private_file_is_parsed(run, monkeypatch):
    want = read_run_table(run, "stages")
    if hasattr(os, "memfd_create"):
        monkeypatch.delattr(os, "memfd_create")
    assert read_run_table(run, "stages") == want
    assert want[0]["started_at"] == datetime(2026, 1, 1, 12, 30, 1, 250, tzinfo=UTC)
