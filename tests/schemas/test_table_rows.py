"""A run's table rows come from DuckDB parsing the very bytes that were verified: the same
rows pyarrow's reader gives, columns cast to their declared types, a part without a
required column refused naming it; parts of one schema parsed by one query, an error
still naming its part."""

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


class _CountingCursor:
    """A cursor that counts the queries run through it (DuckDB's own cannot be patched)."""

    def __init__(self, con, counts: list[str]) -> None:
        self._con, self._counts = con, counts

    def sql(self, query, **kw):
        self._counts.append(query)
        return self._con.sql(query, **kw)

    def execute(self, query, *args):
        self._counts.append(query)
        return self._con.execute(query, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def _metrics_parts(run, n: int) -> list[dict]:
    """``n`` more metrics parts of one schema, one row each; their rows in part order."""
    rows = [{"run_id": run.run_id, "stage": f"s{k}", "metric": "cosine", "value": k / 8,
             "n_samples": k, "output": "y"} for k in range(n)]  # fmt: skip
    for k, row in enumerate(rows):
        write_rows(run, "metrics", [row], f"s{k}")
    return rows


def test_parts_of_one_schema_are_parsed_by_a_fixed_number_of_queries(run, monkeypatch):
    """Seven parts (a run's metrics) cost the queries of one, not two per part: the same
    rows, in the order the parts are read, as part by part."""
    _metrics_parts(run, 6)
    want = [r for p in table_rows.verified_parts(run, "metrics") for r in _one_part_rows(p)]
    queries: list[str] = []
    cursor = table_rows._cursor
    monkeypatch.setattr(table_rows, "_cursor", lambda: _CountingCursor(cursor(), queries))
    rows = read_run_table(run, "metrics")
    assert _nan_free(rows) == _nan_free(want)
    assert len(queries) <= 3, queries


def _one_part_rows(part) -> list[dict]:
    """A part's rows as pyarrow reads them, the schema's columns in their order."""
    table = pq.read_table(pa.BufferReader(part[1]))
    return [{**dict.fromkeys(table_rows.SCHEMAS["metrics"].names), **r} for r in table.to_pylist()]


def test_parts_of_one_schema_still_name_the_part_that_does_not_cast(run):
    """One query over parts of the same schema fails on a bad value; the error still
    names the part holding it (the parts are then read one by one)."""
    for name, value in (("a", "0.25"), ("b", "not a number"), ("c", "0.5")):
        part = pa.table({"run_id": [run.run_id], "stage": [name], "metric": ["l1"],
                         "value": [value]})  # fmt: skip
        _write_part(run, f"tables/metrics/{name}.parquet", part)
    with pytest.raises(ArtifactError, match="cannot read Parquet file of table metrics") as info:
        read_run_table(run, "metrics")
    assert info.value.message.count("metrics/") == 1
    assert str(run.path("tables/metrics/b.parquet")) in info.value.message


def test_a_corrupt_part_among_parts_of_one_schema_is_named(run):
    _metrics_parts(run, 2)
    bad = run.path("tables/metrics/s1.parquet")
    write_part(run, "tables/metrics/s1.parquet", lambda tmp: tmp.write_bytes(b"PAR1 not parquet"))
    with pytest.raises(ArtifactError, match="cannot read Parquet file") as info:
        read_run_table(run, "metrics")
    assert str(bad) in info.value.message


def test_more_parts_than_one_query_takes_are_read_in_chunks(run, monkeypatch):
    """At most PARTS_PER_QUERY private copies are open at once; the rows are the same."""
    _metrics_parts(run, 4)
    want = read_run_table(run, "metrics")
    monkeypatch.setattr(table_rows, "PARTS_PER_QUERY", 2)
    queries: list[str] = []
    cursor = table_rows._cursor
    monkeypatch.setattr(table_rows, "_cursor", lambda: _CountingCursor(cursor(), queries))
    assert _nan_free(read_run_table(run, "metrics")) == _nan_free(want)
    assert len(queries) == 3 + 3 + 2, queries  # 5 parts: 2, 2, then 1 read alone
