"""The read-only DuckDB session over a run store: one view per table, then locked.

Every table of :data:`schemas.table_schemas.SCHEMAS` is a view named like the table over
all runs' ``<root>/<run_id>/tables/<table>/**/*.parquet`` files, read as one Arrow
dataset with the table's schema: columns a file lacks (older runs) read as NULL, and a
table no run has written yet is an empty view with the right columns and types, so a query
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
empty views with the right columns: on a store of 100 runs, hashing every part of every
table cost seconds for a query that reads one.

Why Arrow datasets, not ``read_parquet(glob)`` views: DuckDB 2.0.1 checks file access when a
view runs, so views over ``read_parquet`` need the store root in ``allowed_directories``,
and that would also let ``COPY ... TO`` and ``ATTACH`` write inside the store. Here pyarrow
reads the files (DuckDB still pushes projections and filters down to it), so the session
runs with ``enable_external_access=false``, no allowed directory and a locked configuration:
DuckDB itself can neither read nor write any file.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Collection, Iterable
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from schemas.errors import ArtifactError, QueryError
from schemas.manifest import Manifest
from schemas.owner import bare_run_row, died, interrupted
from schemas.stage_names import STAGE_NAMES
from schemas.store import RunStore
from schemas.store_layout import StoreWarning, run_folders
from schemas.table_digests import check_table, read_manifest
from schemas.table_schemas import SCHEMAS
from schemas.tables import to_arrow

CHAIN_VIEW = "chain"
"""Name of the extra view of stages in chain order."""
VIEWS_DIR = Path(__file__).resolve().parent / "sql" / "views"
"""Derived views: ``<name>.sql`` holds the SELECT of the view ``<name>``."""


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


def _dataset(table: str, files: list[str]) -> ds.Dataset | pa.Table:
    schema = SCHEMAS[table]
    if not files:
        return schema.empty_table()
    return ds.dataset(files, schema=schema, format="parquet")


def _show_interrupted(
    data: ds.Dataset | pa.Table, root: str | Path, runs: Collection[str] | None
) -> ds.Dataset | pa.Table:
    """The runs rows with status ``interrupted`` for runs (of ``runs``, default all) whose
    process died but that no one has marked yet (schemas.owner), and a row for each such
    run killed before it wrote its own: SQL shows what ``qparity runs`` shows."""
    local = RunStore(RunStore(root).root)  # store_files already synced a URL store's copy
    mine = [m for m in local.list_runs() if runs is None or m.run_id in runs]
    dead = {m.run_id: m for m in mine if died(m)}
    if not dead:
        return data
    rows = data.to_table() if isinstance(data, ds.Dataset) else data
    gone = pc.is_in(rows["run_id"], value_set=pa.array(list(dead), pa.string()))
    status = pc.if_else(gone, pa.scalar("interrupted"), rows["status"])
    rows = rows.set_column(rows.schema.get_field_index("status"), "status", status)
    rowless = sorted(set(dead) - set(rows["run_id"].to_pylist()))
    extra = [bare_run_row(interrupted(dead[r])) for r in rowless]
    return pa.concat_tables([rows, to_arrow("runs", extra).cast(rows.schema)])


PTQ_STEPS = {
    "original": "float", "optimized": "prepare", "calibrated": "calibrate",
    "ptq": "pre_export", "quantized": "convert", "hbm": "compile", "board": "board_sim",
}  # fmt: skip
"""PTQ stage -> the QAT chain's stage at the same step (the float model, the model ready for
quantization, fake quant, fixed-point tables, the integer graph, the program, the board),
so a QAT run and a PTQ run of one architecture line up (``qparity diff``)."""


def _chain() -> pa.Table:
    """``(stage, position, step)``: the QAT stages in order, then each PTQ stage at the
    position of its QAT step (the float model before the first: -1)."""
    qat = {name: i for i, name in enumerate(STAGE_NAMES)}
    rows = [(n, i, n) for n, i in qat.items()]
    rows += [(n, qat.get(step, -1), step) for n, step in PTQ_STEPS.items()]
    return pa.table(
        {
            "stage": pa.array([r[0] for r in rows], pa.string()),
            "position": pa.array([r[1] for r in rows], pa.int32()),
            "step": pa.array([r[2] for r in rows], pa.string()),
        }
    )


def connect(
    root: str | Path, sql: str | None = None, runs: Collection[str] | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per table of the store at ``root``, locked down;
    given the statement(s) ``sql`` it is for, only :func:`tables_used` are read, the other
    views are empty; given ``runs`` (run ids), only their rows are read.

    After the views exist the session is read-only for its user: no file access at all
    (``enable_external_access=false``, no ``allowed_directories``), no extension loading,
    and ``lock_configuration=true`` so no ``SET`` can undo it. Files written after this
    call are not seen: connect again for a fresh view of the store.
    """
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        files = store_files(root, None if sql is None else tables_used(sql), runs)
        for table in SCHEMAS:
            data = _dataset(table, files.get(table, []))
            read = table == "runs" and table in files  # a view not read stays empty
            con.register(table, _show_interrupted(data, root, runs) if read else data)
        con.register(CHAIN_VIEW, _chain())
        for path in sorted(VIEWS_DIR.glob("*.sql")):
            con.execute(f"CREATE VIEW {path.stem} AS {path.read_text()}")
        con.execute("SET temp_directory = ''")  # else DuckDB allows writing there
        con.execute("SET allowed_directories = []")
        con.execute("SET allowed_paths = []")
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except (duckdb.Error, pa.ArrowException, OSError) as e:
        con.close()
        raise QueryError(f"cannot open the run store for SQL ({e})", where=str(root)) from e
    return con
