"""The read-only DuckDB session over a run store: every table of every run, then locked.

Every table of :data:`schemas.table_schemas.SCHEMAS` is a table (or view) named like the
table over all runs' ``<root>/<run_id>/tables/<table>/**/*.parquet`` files, with the
table's schema: columns a file lacks (older runs) read as NULL, and a
table no run has written yet is empty with the right columns and types, so a query
never fails on a young store. ``chain`` is one more view: ``(stage, position, step)`` of every
stage in chain order (a PTQ stage at its QAT step's position), for ``ORDER BY`` and "the stage before" questions. Each file of
``analysis/sql/views/`` is one more view over those, named after the file
(``first_divergences``: the first divergent stage and layer of each localized run). A run
whose process died unmarked reads as ``interrupted`` in ``runs`` (:mod:`schemas.owner`), with
a row made from its manifest if it was killed before writing its own.
A run's table whose parts fail the digests its manifest records (:mod:`schemas.table_digests`)
is left out with a warning naming the file: never read as truth, never blocking the rest.
Given the statement it is opened for, a session reads (and verifies) only the tables the
statement names, directly or through a derived view (:func:`tables_used`); the others are
empty tables with the right columns: on a store of 100 runs, hashing every part of every
table cost seconds for a query that reads one.

Why no ``read_parquet`` views: DuckDB 2.0.1 checks file access when a view runs, so views
over ``read_parquet`` need the files in ``allowed_directories`` or ``allowed_paths``, and
both also let ``COPY ... TO`` and ``ATTACH`` write there (measured: ``COPY ... TO <part>
(USE_TMP_FILE false)`` overwrites an allowed part). So the session runs with
``enable_external_access=false``, no allowed path and a locked configuration: DuckDB can
neither read nor write any file once the user's statement runs. Before that, a table whose
verified parts total at most :data:`SMALL_TABLE_BYTES` (4 MB) is read into an in-memory
table by DuckDB's own ``read_parquet`` of exactly those files (bound as a parameter list),
created with the column types :mod:`schemas.table_schemas` declares: pyarrow is not imported
(0.16 s of ``qparity sql``'s start-up, its dataset layer 0.1 s more; bench/cli.py); a larger
one is an Arrow dataset that pyarrow reads as the query runs, DuckDB pushing projections and
filters down to it, so it is never loaded whole.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Collection, Iterable
from pathlib import Path

import duckdb

from schemas.errors import ArtifactError, QueryError
from schemas.manifest import Manifest
from schemas.owner import bare_run_row, died, interrupted
from schemas.stage_names import STAGE_NAMES
from schemas.store import RunStore
from schemas.store_layout import StoreWarning, run_folders
from schemas.table_digests import check_table, read_manifest
from schemas.table_schemas import SCHEMAS

CHAIN_VIEW = "chain"
"""Name of the extra view of stages in chain order."""
VIEWS_DIR = Path(__file__).resolve().parent / "sql" / "views"
"""Derived views: ``<name>.sql`` holds the SELECT of the view ``<name>``."""
SMALL_TABLE_BYTES = 4 * 2**20
"""A table (of the runs read) with at most this many bytes of Parquet parts is read into
the session whole; a larger one is an Arrow dataset read as the query runs. Reading whole
costs about 20 ms of CPU per MB of parts (layer_stats of 4 digits runs, 47 MB: 1.0 s CPU and
455 MB peak memory, against 0.25-0.33 s and 200 MB as a dataset), the dataset layer's
import about 0.1 s: even at about 5 MB. ``runs`` is always read whole (one row per run;
:func:`_mark_interrupted` updates it)."""


_DYNAMIC_RE = re.compile(r"\b(query|query_table)\s*\(", re.IGNORECASE)
_COMMENT_RE = re.compile(r"--[^\n]*")  # our views have no "--" inside a string


def _named(text: str, names: Iterable[str]) -> set[str]:
    return {n for n in names if re.search(rf"\b{n}\b", text, re.IGNORECASE)}


def tables_used(sql: str) -> set[str]:
    """The tables of :data:`SCHEMAS` that ``sql`` may read: each one whose name occurs in
    it as a word, or in the SQL of a derived view whose name does (transitively), comments
    of the views aside: a superset, a name in the statement's comments or strings counts
    too. All of them when the statement builds a table name at run time (``query(...)``,
    ``query_table(...)``)."""
    if _DYNAMIC_RE.search(sql):
        return set(SCHEMAS)
    views = {p.stem: _COMMENT_RE.sub("", p.read_text()) for p in VIEWS_DIR.glob("*.sql")}
    text, seen = sql, set()
    while fresh := _named(text, views) - seen:  # a view over a view: its tables too
        seen |= fresh
        text += "".join(views[v] for v in sorted(fresh))
    return _named(text, SCHEMAS)


def store_files(
    root: str | Path, tables: Iterable[str] | None = None, runs: Collection[str] | None = None
) -> dict[str, list[str]]:
    """The Parquet files of ``tables`` (default: every table) of the runs ``runs``
    (default: every run) under the store ``root``, by table name.

    Runs are the folders of ``root`` whose names do not start with '.' or '_' (the cache
    and other bookkeeping live there); symlinked run folders and table parts are skipped
    with a warning (:mod:`schemas.store_layout`), so no file outside the store is read and
    no run counts twice. A run's table whose parts fail their digests is left out, with a
    warning (:func:`_verified`).
    """
    files: dict[str, list[str]] = {
        table: [] for table in SCHEMAS if tables is None or table in tables
    }
    for run in run_folders(RunStore(root).local_copy()):
        if runs is not None and run.name not in runs:
            continue
        try:
            manifest = read_manifest(run)
        except ArtifactError:
            manifest = None  # check_table says what is wrong, if the run has tables
        for table in files:
            files[table] += [str(p) for p in _verified(run, table, manifest)]
    return files


def _verified(run: Path, table: str, manifest: Manifest | None) -> list[Path]:
    """The run's parts of ``table`` if every one verifies (schemas.table_digests); else
    none, with a StoreWarning naming the file: one changed run never blocks SQL over the
    others, and its rows are never read as truth (``qparity diff`` of it fails instead)."""
    try:
        return check_table(run, table, manifest=manifest)
    except ArtifactError as e:
        warnings.warn(f"{e.message} Its {table} rows are left out.", StoreWarning, stacklevel=2)
        return []


def _load(con: duckdb.DuckDBPyConnection, table: str, files: list[str]) -> None:
    """``table`` in the session with the columns and types of its schema: columns a part
    lacks are NULL, columns the schema lacks are dropped. Read whole by DuckDB when its
    parts are small (always for ``runs``), else an Arrow dataset over them."""
    schema = SCHEMAS[table]
    if table != "runs" and sum(os.path.getsize(f) for f in files) > SMALL_TABLE_BYTES:
        import pyarrow.dataset as ds  # only here: pyarrow's import is 0.16 s, its dataset's 0.1 s

        con.register(table, ds.dataset(files, schema=schema.arrow, format="parquet"))
        return
    columns = ", ".join(f'"{c.name}" {c.type}' for c in schema)
    con.execute(f"CREATE TABLE {table} ({columns})")  # registering Arrow first: ~30 ms
    if files:
        names = ", ".join(f"'{n}'" for n in schema.names)  # our column names: no quotes
        con.execute(
            f"INSERT INTO {table} BY NAME SELECT COLUMNS(lambda c: c IN ({names})) "
            "FROM read_parquet($files, union_by_name = true)",
            {"files": files},
        )


def _arrow_errors() -> tuple[type[Exception], ...]:
    """pyarrow's exception class once pyarrow is imported (a large table's dataset): only
    then can one be raised, and ``qparity sql`` over small tables never imports it."""
    pa = sys.modules.get("pyarrow")
    return (pa.ArrowException,) if pa is not None else ()


def _mark_interrupted(
    con: duckdb.DuckDBPyConnection, root: str | Path, runs: Collection[str] | None
) -> None:
    """Status ``interrupted`` in the runs table for runs (of ``runs``, default all) whose
    process died but that no one has marked yet (schemas.owner), and a row for each such
    run killed before it wrote its own: SQL shows what ``qparity runs`` shows."""
    local = RunStore(RunStore(root).root)  # store_files already synced a URL store's copy
    mine = [m for m in local.list_runs() if runs is None or m.run_id in runs]
    dead = {m.run_id: m for m in mine if died(m)}
    if not dead:
        return
    con.execute(
        "UPDATE runs SET status = 'interrupted' WHERE list_contains($dead, run_id)",
        {"dead": list(dead)},
    )
    have = {r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()}
    extra = [bare_run_row(interrupted(dead[r])) for r in sorted(set(dead) - have)]
    if extra:
        from schemas.tables import to_arrow  # here: it imports pyarrow.parquet

        con.register("_extra", to_arrow("runs", extra))
        con.execute("INSERT INTO runs BY NAME FROM _extra")
        con.unregister("_extra")


PTQ_STEPS = {
    "original": "float", "optimized": "prepare", "calibrated": "calibrate",
    "ptq": "pre_export", "quantized": "convert", "hbm": "compile", "board": "board_sim",
}  # fmt: skip
"""PTQ stage -> the QAT chain's stage at the same step (the float model, the model ready for
quantization, fake quant, fixed-point tables, the integer graph, the program, the board),
so a QAT run and a PTQ run of one architecture line up (``qparity diff``)."""


def _create_chain(con: duckdb.DuckDBPyConnection) -> None:
    """The table ``chain`` of ``(stage, position, step)``: the QAT stages in order, then
    each PTQ stage at the position of its QAT step (the float model before the first: -1)."""
    qat = {name: i for i, name in enumerate(STAGE_NAMES)}
    rows = [(n, i, n) for n, i in qat.items()]
    rows += [(n, qat.get(step, -1), step) for n, step in PTQ_STEPS.items()]
    con.execute(f"CREATE TABLE {CHAIN_VIEW} (stage VARCHAR, position INTEGER, step VARCHAR)")
    con.execute(
        f"INSERT INTO {CHAIN_VIEW} SELECT unnest($stage), unnest($position), unnest($step)",
        {"stage": [r[0] for r in rows], "position": [r[1] for r in rows],
         "step": [r[2] for r in rows]},
    )  # fmt: skip


def open_session() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB in UTC, empty: :func:`connect` fills it (a new database costs
    ~20 ms; a caller that parses the user's SQL first parses it with this one)."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    return con


def connect(
    root: str | Path,
    sql: str | None = None,
    runs: Collection[str] | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one table (:func:`_load`) per table of the store at
    ``root``, locked down; given the statement(s) ``sql`` it is for, only
    :func:`tables_used` are read, the others are empty; given ``runs`` (run ids), only
    their rows are read.

    After the tables and views exist the session is read-only for its user: no file access at all
    (``enable_external_access=false``, no ``allowed_directories``), no extension loading,
    and ``lock_configuration=true`` so no ``SET`` can undo it. Files written after this
    call are not seen: connect again for a fresh view of the store. ``con``: the
    :func:`open_session` to fill (default: a new one); closed when this fails.
    """
    con = open_session() if con is None else con
    try:
        files = store_files(root, None if sql is None else tables_used(sql), runs)
        for table in SCHEMAS:
            _load(con, table, files.get(table, []))
        if "runs" in files:  # a table not read stays empty
            _mark_interrupted(con, root, runs)
        _create_chain(con)
        for path in sorted(VIEWS_DIR.glob("*.sql")):
            con.execute(f"CREATE VIEW {path.stem} AS {path.read_text()}")
        con.execute("SET temp_directory = ''")  # else DuckDB allows writing there
        con.execute("SET allowed_directories = []")
        con.execute("SET allowed_paths = []")
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except (duckdb.Error, OSError, *_arrow_errors()) as e:
        con.close()
        raise QueryError(f"cannot open the run store for SQL ({e})", where=str(root)) from e
    return con
