"""SQL over the run store: views, the read-only lock, and a golden answer per named query."""

from __future__ import annotations

import json
import math
import threading

import pytest

from analysis.query import connect, load_query, named, query_names, run_sql
from schemas.errors import QueryError
from schemas.store import RunStore
from schemas.store_layout import StoreWarning
from schemas.table_schemas import SCHEMAS
from schemas.tables import read_run_table, write_rows


def _loc(run_id, kind, rank, stage=None, base=None, layer=None, op=None, metric=None, value=None):
    return {
        "run_id": run_id, "kind": kind, "rank": rank, "stage": stage, "base_stage": base,
        "layer_id": layer, "op_type": op, "metric": metric, "value": value,
        "threshold": None, "detail": None,
    }  # fmt: skip


def _stat(run_id, base, analysis, layer, op, topo, qdiff, sample_id=None):
    row = {name: None for name in SCHEMAS["layer_stats"].names}
    row.update(
        run_id=run_id, base_stage=base, analysis_stage=analysis, layer_id=layer, op_type=op,
        topo_index=topo, sample_id=sample_id, aggregate=None if sample_id is not None else "all",
        max_qscale_diff=qdiff, cosine=0.99,
    )  # fmt: skip
    return row


def _run(store, started, model, settings, **extra):
    run = store.create_run(model, "name: x\n", "d" * 64, "0.1.0", {}, {})
    row = {
        "run_id": run.run_id, "started_at": started, "finished_at": None, "status": "complete",
        "spec_digest": extra.get("spec_digest", "a" * 64), "model": model, "march": "nash-e",
        "consistency_level": "1", "settings": json.dumps(settings),
        "code_version": extra.get("code_version", "0.1.0"), "tags": json.dumps(extra.get("tags", {})),
    }  # fmt: skip
    write_rows(run, "runs", [row], "run")
    return run


def _metric(run, stage, value):
    write_rows(
        run, "metrics", [{"run_id": run.run_id, "stage": stage, "metric": "top1",
                          "value": value, "n_samples": 100, "output": "output"}], stage,
    )  # fmt: skip


def _stage(run, stage, digest, hit):
    row = {
        "run_id": run.run_id, "stage": stage, "status": "complete", "started_at": None,
        "finished_at": None, "duration_s": 1.0, "artifact_digest": digest, "cache_hit": hit,
    }  # fmt: skip
    write_rows(run, "stages", [row], stage)


@pytest.fixture
def store(tmp_path):
    """Three runs: r1 and r2 of model m (diverge at convert, then at export), r3 of model n
    (not localized). Returns (root, [r1, r2, r3] run ids)."""
    root = tmp_path / "runs"
    s = RunStore(root)
    r1 = _run(s, "2026-01-01T00:00:00", "m", {"rounding": "bpu_round", "policy": {"bits": 8}})
    r2 = _run(s, "2026-01-02T00:00:00", "m", {"rounding": "half_even", "policy": {"bits": 8},
                                               "extra": 1}, code_version="0.2.0", tags={"t": "x"})  # fmt: skip
    r3 = _run(s, "2026-01-03T00:00:00", "n", {})
    write_rows(r1, "localization", [
        _loc(r1.run_id, "stage", 1, "convert", "export", metric="top1", value=0.05),
        _loc(r1.run_id, "layer", 1, "convert", "export", "conv2", "Conv", "max_qscale_diff", 4.0),
        _loc(r1.run_id, "layer", 2, "convert", "export", "add1", "Add", "max_qscale_diff", 2.0),
        _loc(r1.run_id, "sensitive", 1, "convert", "export", "conv2", "Conv", "top1", 0.04),
        _loc(r1.run_id, "sensitive", 2, "convert", "export", "gemm", "Gemm", "top1", 0.01),
    ], "localize")  # fmt: skip
    write_rows(r2, "localization", [
        _loc(r2.run_id, "stage", 1, "export", "pre_export", metric="top1", value=0.02),
        _loc(r2.run_id, "layer", 1, "export", "pre_export", "add1", "Add", "max_qscale_diff", 3.0),
    ], "localize")  # fmt: skip
    write_rows(r1, "layer_stats", [
        _stat(r1.run_id, "export", "convert", "conv1", "Conv", 0, 1.0),
        _stat(r1.run_id, "export", "convert", "conv2", "Conv", 1, 3.0),
        _stat(r1.run_id, "export", "convert", "add1", "Add", 2, 2.0),
        _stat(r1.run_id, "export", "convert", "conv1", "Conv", 0, 99.0, sample_id=0),
        _stat(r1.run_id, "qat", "convert", "conv1", "Conv", 0, 50.0),  # not the adjacent pair
    ], "export--convert")  # fmt: skip
    write_rows(r2, "layer_stats", [
        _stat(r2.run_id, "export", "convert", "conv1", "Conv", 0, 0.0),
        _stat(r2.run_id, "export", "convert", "add1", "Add", 2, 1.0),
    ], "export--convert")  # fmt: skip
    for run, values in ((r1, [0.9, 0.9, 0.85]), (r2, [0.9, 0.88, 0.87])):
        for stage, value in zip(("qat", "export", "convert"), values, strict=True):
            _metric(run, stage, value)
    for stage, d1, d2, hit in (("qat", "a1", "a1", True), ("export", "b1", "b2", False)):
        _stage(r1, stage, d1, False)
        _stage(r2, stage, d2, hit)
    return root, [r1.run_id, r2.run_id, r3.run_id]


def test_every_table_is_a_typed_view_even_on_an_empty_store(tmp_path):
    con = connect(tmp_path / "nothing-here")
    for table, schema in SCHEMAS.items():
        desc = con.sql(f"DESCRIBE {table}").fetchall()
        assert [r[0] for r in desc] == schema.names
        assert con.sql(f"SELECT count(*) FROM {table}").fetchall() == [(0,)]
    assert (
        run_sql(tmp_path, "SELECT * FROM layer_stats").schema.names == SCHEMAS["layer_stats"].names
    )
    assert named(tmp_path, "first_divergence").num_rows == 0


def test_old_files_without_a_new_column_read_as_null(store):
    root, (r1, *_) = store
    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas.table_digests import write_part

    old = pa.table({"run_id": [r1], "stage": ["x"], "metric": ["top1"], "value": [1.0]})
    run = RunStore(root).open(r1)  # written as an older qparity did: recorded, no n_samples
    write_part(run, "tables/metrics/old.parquet", lambda path: pq.write_table(old, path))
    rows = run_sql(root, "SELECT n_samples, output FROM metrics WHERE stage = 'x'").to_pylist()
    assert rows == [{"n_samples": None, "output": None}]
    old_rows = [r for r in read_run_table(run, "metrics") if r["stage"] == "x"]
    assert old_rows[0]["output"] is None  # and the product's reader agrees


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("COPY (SELECT 1) TO '{root}/r/out.csv'", "COPY"),
        ("ATTACH '{root}/x.db' AS x", "ATTACH"),
        ("INSTALL httpfs", "LOAD"),
        ("LOAD httpfs", "LOAD"),
        ("CREATE TABLE t (a INTEGER)", "CREATE"),
        ("INSERT INTO runs (run_id) VALUES ('x')", "INSERT"),
        ("SET enable_external_access = true", "SET"),
        ("SELECT 1; SELECT 2", None),
        ("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1", "CREATE"),
        ("PRAGMA enable_profiling", None),
    ],
)
def test_run_sql_refuses_everything_but_one_read(store, sql, kind):
    root, _ = store
    with pytest.raises(QueryError, match="read-only") as e:
        run_sql(root, sql.format(root=root))
    if kind:
        assert f"{kind} statements are refused" in str(e.value)
    assert not (root / "r" / "out.csv").exists() and not (root / "x.db").exists()


def test_the_session_cannot_touch_files_even_without_the_parser_check(store, tmp_path):
    root, _ = store
    outside = tmp_path / "outside.csv"
    outside.write_text("a\n1\n")
    con = connect(root)
    for sql in (
        f"SELECT * FROM read_csv('{outside}')",
        f"SELECT * FROM read_parquet('{root}/*/tables/runs/*.parquet')",
        f"COPY (SELECT 1) TO '{root}/copied.csv'",
        f"ATTACH '{root}/x.db' AS x",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
    ):
        with pytest.raises(Exception, match="disabled|locked|Permission|not allowed"):
            con.execute(sql)
    assert not (root / "copied.csv").exists() and not (root / "x.db").exists()


def test_run_sql_reads(store):
    root, (r1, r2, r3) = store
    got = run_sql(root, "SELECT run_id FROM runs WHERE model = $m ORDER BY run_id", {"m": "m"})
    assert got.column("run_id").to_pylist() == sorted([r1, r2])
    assert run_sql(root, "DESCRIBE runs").num_rows == len(SCHEMAS["runs"].names)
    assert run_sql(root, "PRAGMA table_info('metrics')").num_rows == len(SCHEMAS["metrics"].names)
    assert run_sql(root, "EXPLAIN SELECT * FROM runs").num_rows >= 1
    assert {"chain", "first_divergences"} <= set(
        run_sql(root, "SHOW TABLES").column("name").to_pylist()
    )


def test_a_symlinked_run_folder_or_table_part_is_not_read_and_not_counted_twice(store, tmp_path):
    root, (r1, *_) = store
    (root / "r1-twin").symlink_to(root / r1, target_is_directory=True)
    parts = root / r1 / "tables" / "metrics"
    (parts / "again.parquet").symlink_to(parts / "qat.parquet")
    with pytest.warns(StoreWarning) as caught:
        runs = run_sql(root, "SELECT count(*) AS n FROM runs").to_pylist()
        metrics = run_sql(root, "SELECT count(*) AS n FROM metrics WHERE stage = 'qat'")
    assert runs == [{"n": 3}] and metrics.to_pylist() == [{"n": 2}]
    named = " ".join(str(w.message) for w in caught)
    assert str(root / "r1-twin") in named and str(parts / "again.parquet") in named


@pytest.mark.parametrize(
    "sql",
    [
        "PIVOT runs ON status USING count(*) GROUP BY model ORDER BY model",
        "WITH r AS (SELECT model, status FROM runs) PIVOT r ON status USING count(*) "
        "GROUP BY model ORDER BY model",
        "SELECT * FROM (PIVOT runs ON status USING count(*) GROUP BY model) ORDER BY model",
    ],
)
def test_pivot_is_a_read(store, sql):
    root, _ = store
    assert run_sql(root, sql).to_pylist() == [
        {"model": "m", "complete": 2},
        {"model": "n", "complete": 1},
    ]


def test_unpivot_is_a_read(store):
    root, (r1, *_) = store
    sql = "UNPIVOT (SELECT run_id, model, march FROM runs WHERE run_id = $r) ON model, march"
    got = run_sql(root, f"{sql} INTO NAME k VALUE v ORDER BY k", {"r": r1}).to_pylist()
    assert got == [
        {"run_id": r1, "k": "march", "v": "nash-e"},
        {"run_id": r1, "k": "model", "v": "m"},
    ]


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE t AS PIVOT runs ON status",
        "COPY (PIVOT runs ON status) TO '{root}/r/out.csv'",
        "INSERT INTO runs BY NAME (PIVOT runs ON status)",
        "EXPLAIN ANALYZE CREATE TABLE t AS PIVOT runs ON status",
    ],
)
def test_a_pivot_inside_a_write_is_still_refused(store, sql):
    root, _ = store
    with pytest.raises(QueryError, match="read-only"):
        run_sql(root, sql.format(root=root))
    assert not (root / "r" / "out.csv").exists()


LONG = "SELECT count(*) FROM range(100000) a, range(100000) b, range(100000) c"


def test_a_query_past_the_time_limit_is_cancelled_with_a_query_error(store):
    root, _ = store
    with pytest.raises(QueryError, match="time limit of 0.2 s") as e:
        run_sql(root, LONG, timeout_s=0.2)
    assert "--timeout" in e.value.hint and "QPARITY_SQL_TIMEOUT" in e.value.hint
    assert run_sql(root, "SELECT 1 AS x", timeout_s=0.2).to_pylist() == [{"x": 1}]


def test_ctrl_c_while_the_worker_thread_starts_still_cancels_the_query(store, monkeypatch):
    """The race CI hit: SIGINT lands in ``Thread.start`` (it waits for the thread) after
    the query began; the call used to hang closing a connection its query still held."""
    import analysis.query as q

    real_thread, began, original = threading.Thread, threading.Event(), q.execute

    def traced(*args, **kwargs):
        began.set()
        return original(*args, **kwargs)

    class StartInterrupted(real_thread):
        def start(self):
            super().start()
            began.wait(10)
            raise KeyboardInterrupt

    monkeypatch.setattr(q, "execute", traced)
    monkeypatch.setattr(threading, "Thread", StartInterrupted)
    box = {}

    def call():
        try:
            run_sql(store[0], LONG, timeout_s=None)
        except BaseException as e:  # noqa: BLE001 - the outcome is the test
            box["error"] = e

    caller = real_thread(target=call, daemon=True)
    caller.start()
    caller.join(60)
    assert not caller.is_alive(), "Ctrl-C during Thread.start left the query running"
    assert isinstance(box.get("error"), KeyboardInterrupt)
    workers = [t for t in threading.enumerate() if t.name == "qparity-sql"]
    for t in workers:
        t.join(10)
    assert not any(t.is_alive() for t in workers), "the query still runs after Ctrl-C"


def test_the_first_divergences_view_holds_the_localized_runs(store):
    root, (r1, r2, _) = store  # r1 and r2 are localized, the third run is not
    view = run_sql(root, "SELECT * FROM first_divergences ORDER BY run_id")
    assert view.column("run_id").to_pylist() == sorted([r1, r2])
    joined = named(root, "first_divergence").select(view.column_names).to_pylist()
    assert view.to_pylist() == sorted((r for r in joined if r["run_id"] in (r1, r2)),
                                      key=lambda r: r["run_id"])  # fmt: skip
    with pytest.raises(QueryError, match="query failed"):
        run_sql(root, "SELECT no_such_column FROM runs")


def test_named_query_errors_list_names_and_parameters(store):
    root, _ = store
    with pytest.raises(QueryError, match="first_divergence") as e:
        named(root, "no_such_query")
    assert "model_history" in str(e.value)
    with pytest.raises(
        QueryError, match=r"missing model.*Fix: pass exactly its parameters: model\."
    ):
        named(root, "model_history")
    with pytest.raises(QueryError, match="unknown extra"):
        named(root, "model_history", model="m", extra=1)


def test_every_named_query_has_a_header_and_declares_its_parameters():
    assert {"first_divergence", "model_history", "convert_error_ops", "stage_metrics",
            "layer_stats_pair", "run_diff_run", "run_diff_stages", "run_diff_metrics",
            "run_diff_localization"} <= set(query_names())  # fmt: skip
    for name in query_names():
        q = load_query(name)
        assert q.doc.startswith(f"{name}:"), name
        declared = q.doc.split("Parameters:")[1]
        for param in q.params:
            assert f"${param}" in declared, (name, param)


def test_first_divergence_golden(store):
    root, (r1, r2, r3) = store
    got = named(root, "first_divergence").select(
        [
            "run_id",
            "model",
            "first_stage",
            "base_stage",
            "stage_value",
            "first_layer",
            "first_op_type",
        ]
    )
    assert got.to_pylist() == [
        dict(run_id=r1, model="m", first_stage="convert", base_stage="export", stage_value=0.05,
             first_layer="conv2", first_op_type="Conv"),
        dict(run_id=r2, model="m", first_stage="export", base_stage="pre_export", stage_value=0.02,
             first_layer="add1", first_op_type="Add"),
        dict(run_id=r3, model="n", first_stage=None, base_stage=None, stage_value=None,
             first_layer=None, first_op_type=None),
    ]  # fmt: skip


def test_model_history_golden(store):
    root, (r1, r2, _) = store
    got = named(root, "model_history", model="m")
    assert got.column("run_id").to_pylist() == [r1, r2]
    assert got.column("first_stage").to_pylist() == ["convert", "export"]
    assert got.column("code_version").to_pylist() == ["0.1.0", "0.2.0"]
    assert named(root, "model_history", model="nope").num_rows == 0


def test_convert_error_ops_golden(store):
    root, _ = store
    got = named(root, "convert_error_ops", stage="convert").to_pylist()
    assert got == [
        dict(op_type="Conv", n_first_divergent=1, n_sensitive=1, n_runs=2, n_layers=3,
             mean_max_qscale_diff=pytest.approx(4 / 3), max_max_qscale_diff=3.0),
        dict(op_type="Gemm", n_first_divergent=0, n_sensitive=1, n_runs=0, n_layers=0,
             mean_max_qscale_diff=None, max_max_qscale_diff=None),
        dict(op_type="Add", n_first_divergent=0, n_sensitive=0, n_runs=2, n_layers=2,
             mean_max_qscale_diff=1.5, max_max_qscale_diff=2.0),
    ]  # fmt: skip


def test_stage_metrics_golden(store):
    root, (r1, r2, _) = store
    got = named(root, "stage_metrics").to_pylist()
    assert [(r["run_id"], r["stage"], r["top1"]) for r in got] == [
        (r1, "qat", 0.9), (r1, "export", 0.9), (r1, "convert", 0.85),
        (r2, "qat", 0.9), (r2, "export", 0.88), (r2, "convert", 0.87),
    ]  # fmt: skip
    deltas = [r["delta_prev"] for r in got]
    assert deltas[0] is None and deltas[3] is None
    assert deltas[2] == pytest.approx(-0.05) and deltas[4] == pytest.approx(-0.02)


def test_layer_stats_pair_golden(store):
    root, (r1, _, _) = store
    got = named(root, "layer_stats_pair", run_id=r1, base_stage="export", analysis_stage="convert")
    assert got.column("layer_id").to_pylist() == ["conv1", "conv2", "add1"]
    assert got.column("max_qscale_diff").to_pylist() == [1.0, 3.0, 2.0]
    assert named(root, "runs_by_id", ids=[r1, "nope"]).column("run_id").to_pylist() == [r1]


def test_the_first_divergences_view_takes_the_first_rank_1_stage_in_chain_order(tmp_path):
    """Runs localized before ranks counted on past a passing pair have two rank-1 stages."""
    s = RunStore(tmp_path / "runs")
    run = _run(s, "2026-01-01T00:00:00", "m", {})
    write_rows(run, "localization", [
        _loc(run.run_id, "stage", 1, "convert", "export", metric="own_error_steps", value=19.0),
        _loc(run.run_id, "stage", 0, "compile", "convert", metric="own_error_steps", value=0.0),
        _loc(run.run_id, "stage", 1, "board_sim", "compile", metric="own_error_steps", value=2.0),
    ], "localize")  # fmt: skip
    view = run_sql(s.root, "SELECT first_stage, stage_value FROM first_divergences").to_pylist()
    assert view == [{"first_stage": "convert", "stage_value": 19.0}]


def test_sql_leaves_out_a_table_part_changed_after_its_run_wrote_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = RunStore(tmp_path)
    a, b = (_run(store, f"2026-01-0{i}T00:00:00", "m", {}) for i in (1, 2))
    _metric(a, "qat", 0.5)
    _metric(b, "qat", 0.7)
    part = a.path("tables/metrics/qat.parquet")
    rows = pq.read_table(part).to_pylist()
    rows[0]["value"] = 0.9  # a valid Parquet file: only its digest tells
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(part)), part)
    with pytest.warns(StoreWarning, match="changed after the run wrote it") as caught:
        found = run_sql(tmp_path, "SELECT run_id, value FROM metrics").to_pylist()
    assert found == [{"run_id": b.run_id, "value": 0.7}]
    assert any(str(part) in str(w.message) for w in caught)


def test_the_output_metrics_view_has_one_row_per_stage_and_output(tmp_path):
    s = RunStore(tmp_path / "runs")
    run = _run(s, "2026-01-01T00:00:00", "m", {})
    rows = [{"run_id": run.run_id, "stage": stage, "metric": metric, "value": value,
             "n_samples": 8, "output": output}
            for stage, output, metric, value in (
                ("convert", "output.boxes", "cosine", 0.9), ("convert", "output.boxes", "l1", 0.2),
                ("export", "output.boxes", "cosine", 0.99), ("export", "output.scores", "cosine", 1.0),
                ("export", None, "map50", 0.8))]  # fmt: skip
    write_rows(run, "metrics", rows, "evaluate")
    got = run_sql(s.root, "SELECT stage, output, cosine, l1 FROM output_metrics").to_pylist()
    assert [tuple(r.values()) for r in got] == [
        ("export", "output.boxes", 0.99, None), ("export", "output.scores", 1.0, None),
        ("convert", "output.boxes", 0.9, 0.2),
    ]  # fmt: skip


@pytest.mark.parametrize("limit", [math.inf, 1e300, threading.TIMEOUT_MAX])
def test_a_limit_no_wait_can_take_means_no_limit(store, limit):
    """`--timeout inf` (or 1e300) raised OverflowError from the wait once the query ran
    (an internal error, then a crash at exit from the worker it left running)."""
    assert run_sql(store[0], "SELECT 1 AS x", timeout_s=limit).to_pylist() == [{"x": 1}]


def test_a_limit_that_is_not_a_number_is_a_query_error(store):
    with pytest.raises(QueryError, match="not a number") as e:
        run_sql(store[0], "SELECT 1", timeout_s=math.nan)
    assert "--timeout" in e.value.hint


def test_a_fifo_for_a_table_part_is_left_out_with_a_warning(store):
    import os

    from tests.no_hang import fails_if_blocked

    root, (r1, *_) = store
    part = root / r1 / "tables" / "metrics" / "qat.parquet"
    part.unlink()
    os.mkfifo(part)
    with fails_if_blocked(), pytest.warns(StoreWarning, match="a FIFO") as caught:
        rows = run_sql(root, "SELECT count(*) AS n FROM metrics WHERE run_id = $r", {"r": r1})
    assert rows.to_pylist() == [{"n": 0}]
    assert str(part) in " ".join(str(w.message) for w in caught)
