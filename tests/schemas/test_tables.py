"""Tests of the Arrow schemas, the Parquet writer and the DuckDB reader."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from schemas.errors import ArtifactError
from schemas.store import RunStore
from schemas.table_schemas import (
    LAYER_TENSORS,
    METRICS,
    RUNS,
    SCHEMAS,
    STAGES,
    Column,
    arrow_type,
)
from schemas.tables import read_table, write_rows


def new_run(store: RunStore):
    return store.create_run("demo", "", "ab" * 32, "0.1.0", {}, {})


def metric_rows(run_id: str, n: int = 3) -> list[dict]:
    return [
        {
            "run_id": run_id,
            "stage": "calibrate",
            "metric": f"m{i}",
            "value": i / 2,
            "n_samples": 10,
            "output": "output",
        }
        for i in range(n)
    ]


def test_schemas_have_the_design_columns():
    assert RUNS.names == [
        "run_id",
        "started_at",
        "finished_at",
        "status",
        "spec_digest",
        "model",
        "march",
        "consistency_level",
        "settings",
        "code_version",
        "tags",
    ]
    assert STAGES.names == [
        "run_id",
        "stage",
        "status",
        "started_at",
        "finished_at",
        "duration_s",
        "artifact_digest",
        "cache_hit",
    ]
    assert METRICS.names == ["run_id", "stage", "metric", "value", "n_samples", "output"]
    assert RUNS.arrow.field("started_at").type == pa.timestamp("us", tz="UTC")
    assert {"runs", "stages", "metrics", "layer_stats", "layer_tensors"} <= SCHEMAS.keys()
    assert {"badcases", "sensitivity", "localization", "faults"} <= SCHEMAS.keys()
    design = "run_id base_stage analysis_stage layer_id op_type topo_index dtype scale sample_id"
    design += " cosine mse l1 max_abs sqnr_db max_qscale_diff exact_ratio"
    assert set(design.split()) <= set(SCHEMAS["layer_stats"].names)


def test_round_trip_over_runs(tmp_path):
    store = RunStore(tmp_path)
    a, b = new_run(store), new_run(store)
    write_rows(a, "metrics", metric_rows(a.run_id), "calibrate")
    write_rows(b, "metrics", metric_rows(b.run_id, 2), "calibrate")
    table = read_table(tmp_path, "metrics")
    assert table.schema.names == METRICS.names
    assert table.schema.field("n_samples").type == pa.int64()
    assert table.num_rows == 5
    got = sorted(zip(table["run_id"].to_pylist(), table["value"].to_pylist(), strict=True))
    assert got == sorted([(a.run_id, v) for v in (0, 0.5, 1.0)] + [(b.run_id, v) for v in (0, 0.5)])


def test_rewrite_same_part_replaces_rows(tmp_path):
    store = RunStore(tmp_path)
    run = new_run(store)
    write_rows(run, "metrics", metric_rows(run.run_id), "calibrate")
    write_rows(run, "metrics", metric_rows(run.run_id), "calibrate")
    assert read_table(tmp_path, "metrics").num_rows == 3
    write_rows(run, "metrics", metric_rows(run.run_id, 1), "convert")
    assert read_table(tmp_path, "metrics").num_rows == 4
    assert not [p for p in (run.root / "tables").rglob("*") if p.name.startswith(".")]


def test_timestamps_and_nulls_round_trip(tmp_path):
    store = RunStore(tmp_path)
    run = new_run(store)
    start = "2025-01-02T03:04:05.123456+00:00"
    row = {
        "run_id": run.run_id,
        "stage": "prepare",
        "status": "running",
        "started_at": start,
        "finished_at": None,
        "duration_s": None,
        "artifact_digest": None,
        "cache_hit": False,
    }
    write_rows(run, "stages", [row], "prepare")
    table = read_table(tmp_path, "stages")
    assert table.schema.field("started_at").type == pa.timestamp("us", tz="UTC")
    got = table.to_pylist()[0]
    assert got["started_at"] == datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert got["finished_at"] is None and got["cache_hit"] is False


def test_empty_store_gives_empty_table(tmp_path):
    table = read_table(tmp_path, "runs")
    assert table.num_rows == 0 and table.schema == RUNS.arrow


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"valeu": 1.0}, "metrics.*unknown column valeu"),
        ({"n_samples": 2.5}, "metrics, column n_samples.*2.5.*expected int"),
        ({"value": "high"}, "metrics, column value.*'high'"),
        ({"value": True}, "column value"),
        ({"metric": None}, "column metric: row 0 is null"),
    ],
)
def test_wrong_rows_refused(tmp_path, change, match):
    run = new_run(RunStore(tmp_path))
    row = {**metric_rows(run.run_id, 1)[0], **change}
    with pytest.raises(ArtifactError, match=match):
        write_rows(run, "metrics", [row], "p")
    assert not (run.root / "tables" / "metrics").exists()


def test_missing_column_unknown_table_and_bad_part(tmp_path):
    run = new_run(RunStore(tmp_path))
    row = metric_rows(run.run_id, 1)[0]
    del row["n_samples"]
    with pytest.raises(ArtifactError, match="metrics.*missing column n_samples"):
        write_rows(run, "metrics", [row], "p")
    with pytest.raises(ArtifactError, match="unknown table 'metricz'"):
        write_rows(run, "metricz", [], "p")
    with pytest.raises(ArtifactError, match="invalid part"):
        write_rows(run, "metrics", metric_rows(run.run_id), "../../x")


def test_columns_are_declared_once_with_sql_types_and_arrow_is_derived():
    assert LAYER_TENSORS.arrow.field("values").type == pa.list_(pa.float32())
    assert [c.type for c in METRICS][:4] == ["VARCHAR", "VARCHAR", "VARCHAR", "DOUBLE"]
    assert arrow_type("BIGINT[]") == pa.list_(pa.int64())
    assert RUNS.arrow is RUNS.arrow  # derived once
    with pytest.raises(ValueError, match="unknown type 'TEXT'"):
        Column("x", "TEXT")
