"""The SQL session: its runs view agrees with ``qparity runs`` on killed runs; a statement
reads (and verifies) only the tables it uses."""

from __future__ import annotations

import warnings

import pytest

from analysis import sql_views
from analysis.query import run_sql
from schemas.store import RunStore
from schemas.store_layout import StoreWarning
from schemas.tables import write_rows


def test_a_killed_run_without_its_runs_row_reads_interrupted(tmp_path, monkeypatch):
    run = RunStore(tmp_path).create_run("tiny", "", "ab" * 32, "0.1.0", {}, {})
    monkeypatch.setattr(sql_views, "died", lambda m: m.status == "running")  # owner gone
    rows = run_sql(tmp_path, "SELECT run_id, status, finished_at FROM runs").to_pylist()
    assert rows == [
        {"run_id": run.run_id, "status": "interrupted", "finished_at": rows[0]["finished_at"]}
    ]
    assert rows[0]["finished_at"] is not None


def test_a_statement_reads_the_tables_it_names_directly_or_through_a_view():
    assert sql_views.tables_used("SELECT * FROM first_divergences") == {"localization"}
    assert sql_views.tables_used("SELECT run_id FROM Output_Metrics") == {"metrics"}
    assert sql_views.tables_used("PRAGMA table_info('runs')") == {"runs"}
    assert sql_views.tables_used("SELECT 1 AS x") == set()
    dynamic = "SELECT * FROM query_table('layer_' || 'stats')"
    assert sql_views.tables_used(dynamic) == set(sql_views.SCHEMAS)


def test_a_view_over_a_view_reads_the_tables_of_both(tmp_path, monkeypatch):
    (tmp_path / "outer.sql").write_text("-- over stages\nSELECT * FROM inner_view")
    (tmp_path / "inner_view.sql").write_text("SELECT * FROM metrics")
    monkeypatch.setattr(sql_views, "VIEWS_DIR", tmp_path)
    assert sql_views.tables_used("SELECT * FROM outer") == {"metrics"}


def _changed_metrics_part(root):
    """A run with one metrics row whose part was rewritten after the run wrote it."""
    import pyarrow.parquet as pq

    run = RunStore(root).create_run("tiny", "", "ab" * 32, "0.1.0", {}, {})
    row = {"run_id": run.run_id, "stage": "qat", "metric": "top1", "value": 0.5,
           "n_samples": 8, "output": "y"}  # fmt: skip
    write_rows(run, "metrics", [row], "qat")
    part = run.path("tables/metrics/qat.parquet")
    pq.write_table(pq.read_table(part).slice(0, 0), part)  # a valid file, another digest
    return run


def test_a_query_verifies_and_reads_only_the_tables_it_uses(tmp_path):
    run = _changed_metrics_part(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the changed metrics part is not even hashed
        assert run_sql(tmp_path, "SELECT count(*) AS n FROM layer_stats").to_pylist() == [{"n": 0}]
    with pytest.warns(StoreWarning, match="changed after the run wrote it"):
        assert run_sql(tmp_path, "SELECT * FROM output_metrics").num_rows == 0
    assert run.run_id in {m.run_id for m in RunStore(tmp_path).list_runs()}


def test_every_table_reads_with_the_columns_and_types_of_its_schema(tmp_path):
    """The tables DuckDB reads itself are created from the SQL types SCHEMAS declares: they
    read back as the Arrow types the writers derive from the same declaration."""
    con = sql_views.connect(tmp_path)
    try:
        for table, schema in sql_views.SCHEMAS.items():
            got = con.sql(f"SELECT * FROM {table}").to_arrow_table().schema
            assert got.names == schema.names, table
            for field in schema.arrow:
                want, have = field.type, got.field(field.name).type
                if want.num_fields:  # a list: its item's name is DuckDB's own
                    want, have = want.value_type, have.value_type
                assert have == want, (table, field.name)
    finally:
        con.close()


def test_a_large_table_reads_as_a_dataset_with_the_same_rows(tmp_path, monkeypatch):
    """Over SMALL_TABLE_BYTES a table stays an Arrow dataset (never loaded whole): the
    same rows, columns and types as the table DuckDB reads itself."""
    run = RunStore(tmp_path).create_run("tiny", "", "ab" * 32, "0.1.0", {}, {})
    rows = [{"run_id": run.run_id, "stage": s, "metric": "top1", "value": v, "n_samples": 8,
             "output": None} for s, v in (("qat", 0.5), ("convert", 0.25))]  # fmt: skip
    write_rows(run, "metrics", rows, "qat")
    sql = "SELECT * FROM metrics ORDER BY stage"
    small = run_sql(tmp_path, sql)
    monkeypatch.setattr(sql_views, "SMALL_TABLE_BYTES", 0)
    large = run_sql(tmp_path, sql)
    assert large.equals(small)
    assert small.to_pylist()[0] == rows[1]
    con = sql_views.connect(tmp_path, sql)
    kinds = dict(con.sql("SELECT table_name, table_type FROM information_schema.tables").fetchall())
    con.close()
    assert kinds["metrics"] == "VIEW" and kinds["runs"] == "BASE TABLE"
