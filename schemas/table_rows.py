"""One run's table as rows, parsed by DuckDB from exactly the bytes that were verified.

Each part is read once: its sha256 is checked against the run's manifest
(:mod:`schemas.table_digests`) on those bytes, and DuckDB parses a private, sealed
in-memory copy of them (a ``memfd`` it opens as ``/proc/self/fd/N``; where the system has
none, a file in a private temporary folder), never the path a second time: a part changed
after the check is not read. DuckDB, not pyarrow: ``qparity show`` reads a run's metrics
without importing pyarrow and numpy (about 0.17 s of CPU against DuckDB's 0.11 s;
bench/cli.py). The columns of :mod:`schemas.table_schemas` are cast to their declared
types; a part without a required column, or whose values do not cast, is an ArtifactError
naming it (a part of another table, or a corrupt one). Parts that share one Parquet schema
(a run's metrics: one part per stage) are parsed by one query (up to 64 at a time), 3
queries instead of 2 per part; when it fails, they are read again one by one to name the
part at fault.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.errors import ArtifactError
from schemas.fileio import read_regular, sha256_bytes
from schemas.store import Run
from schemas.table_digests import check_table
from schemas.table_schemas import SCHEMAS, TableSchema

if TYPE_CHECKING:
    import duckdb

CORRUPT_HINT = "the file is corrupt, truncated or foreign: rerun the run's stages (or delete it)"
_DATABASES: dict[int, duckdb.DuckDBPyConnection] = {}  # by process: never one from a fork
_LOCK = threading.Lock()
_LAYOUT_SQL = "SELECT * FROM parquet_schema($files)"  # file_name first, then one element
PARTS_PER_QUERY = 64
"""Parts parsed by one query at most: their private copies are open at once."""


def verified_parts(run: Run, table: str) -> list[tuple[Path, bytes]]:
    """Each part of the run's ``table`` with its bytes, read once and checked against the
    sha256 the manifest records (ArtifactError naming a part that changed); symlinked parts
    are not read (:mod:`schemas.store_layout`). A run from before digests: read unverified."""
    if table not in SCHEMAS:  # a known table name, never a path
        raise ArtifactError(f"unknown table {table!r}", hint=f"use one of: {', '.join(SCHEMAS)}")
    blobs: dict[Path, bytes] = {}

    def digest(path: Path) -> str:
        blobs[path] = read_regular(path)  # a FIFO: an ArtifactError, never a hang
        return sha256_bytes(blobs[path])

    files = check_table(run.root, table, digest)
    return [(f, blobs[f] if f in blobs else read_regular(f)) for f in files]


def read_run_table(run: Run, table: str) -> list[dict[str, Any]]:
    """Rows of one table of one run, as dicts (empty if the run has none): every column
    of any part, a part's missing ones None, in the order the parts are read. Up to
    :data:`PARTS_PER_QUERY` parts that share one Parquet schema are parsed by one query;
    otherwise, or when that query fails, part by part, so an error names its part."""
    parts = verified_parts(run, table)
    names: dict[str, None] = {}
    read: list[dict[str, Any]] = []
    with contextlib.closing(_cursor()) if parts else contextlib.nullcontext() as con:
        for at in range(0, len(parts), PARTS_PER_QUERY):
            for columns, rows in _chunk_rows(con, table, parts[at : at + PARTS_PER_QUERY]):
                names |= dict.fromkeys(columns)
                read += [dict(zip(columns, row, strict=True)) for row in rows]
    return [{**dict.fromkeys(names), **row} for row in read]


def _chunk_rows(
    con: duckdb.DuckDBPyConnection, table: str, parts: list[tuple[Path, bytes]]
) -> list[tuple[list[str], list[tuple]]]:
    """(columns, rows) of the parts: one pair for all of them when one query reads them
    (:func:`_same_schema_rows`), else one per part (ArtifactError naming a bad one)."""
    import duckdb  # here: a module importing this one need not load DuckDB

    with contextlib.ExitStack() as copies:
        sources = [_enter_copy(copies, table, path, data) for path, data in parts]
        if len(parts) > 1:
            try:
                read = _same_schema_rows(con, SCHEMAS[table], sources)
            except (duckdb.Error, ValueError):
                read = None  # read them one by one below: the error names its part
            if read is not None:
                return [read]
        paths = [path for path, _ in parts]
        return [_part_rows(con, table, p, src) for p, src in zip(paths, sources, strict=True)]


def _enter_copy(copies: contextlib.ExitStack, table: str, path: Path, data: bytes) -> str:
    """A private copy of one part's bytes (:func:`_private_copy`) open until ``copies``
    closes; an ArtifactError naming the part if it cannot be made."""
    try:
        return copies.enter_context(_private_copy(data))
    except OSError as e:
        raise ArtifactError(
            f"cannot copy Parquet file of table {table} to parse it ({e})",
            where=str(path),
            hint="free memory or space in the temporary folder, then retry",
        ) from e


def _same_schema_rows(
    con: duckdb.DuckDBPyConnection, schema: TableSchema, sources: list[str]
) -> tuple[list[str], list[tuple]] | None:
    """The columns and rows of all parts from one query when they have the same Parquet
    schema (names, types, order: what reading them one by one gives); None when they
    differ. ValueError if they lack a column the schema requires."""
    layouts: dict[str, list[tuple]] = {}
    for file, *element in con.execute(_LAYOUT_SQL, {"files": sources}).fetchall():
        layouts.setdefault(file, []).append(tuple(element))
    if len(layouts) != len(sources) or any(v != layouts[sources[0]] for v in layouts.values()):
        return None
    return _cast_rows(con, schema, "$files", {"files": sources})


def _part_rows(
    con: duckdb.DuckDBPyConnection, table: str, path: Path, source: str
) -> tuple[list[str], list[tuple]]:
    """The columns and rows of one part; ArtifactError naming it if it cannot be read."""
    import duckdb

    try:
        return _cast_rows(con, SCHEMAS[table], "$file", {"file": source})
    except (duckdb.Error, ValueError) as e:
        raise ArtifactError(
            f"cannot read Parquet file of table {table} ({e})", where=str(path), hint=CORRUPT_HINT
        ) from e


def _cast_rows(
    con: duckdb.DuckDBPyConnection, schema: TableSchema, files: str, params: dict[str, Any]
) -> tuple[list[str], list[tuple]]:
    """The columns (the parts' own order) and rows of ``read_parquet(<files>)``, the
    schema's columns cast to their declared types; ValueError if a column the schema
    requires is missing."""
    columns = con.sql(f"SELECT * FROM read_parquet({files})", params=params).columns
    missing = [c.name for c in schema if not c.nullable and c.name not in columns]
    if missing:
        raise ValueError(f"required column {missing[0]} is missing")
    types = {c.name: c.type for c in schema}
    select = ", ".join(
        f"CAST({_quoted(n)} AS {types[n]}) AS {_quoted(n)}" if n in types else _quoted(n)
        for n in columns
    )
    return columns, con.sql(f"SELECT {select} FROM read_parquet({files})", params=params).fetchall()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextlib.contextmanager
def _private_copy(data: bytes) -> Iterator[str]:
    """A path whose file holds ``data`` and that no one else writes: a sealed memfd
    (Linux), else a file in a private temporary folder; gone after the block."""
    if not hasattr(os, "memfd_create"):
        with tempfile.TemporaryDirectory(prefix="qparity-part-") as folder:
            path = Path(folder) / "part.parquet"
            path.write_bytes(data)
            yield str(path)
        return
    import fcntl

    fd = os.memfd_create("qparity-part", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        with os.fdopen(os.dup(fd), "wb") as fh:
            fh.write(data)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _cursor() -> duckdb.DuckDBPyConnection:
    """A cursor of this process's in-memory database for parsing parts (a new database
    costs ~12 ms of CPU, a cursor 0.03 ms); no file cache, so a reused fd number never
    reads another part's bytes."""
    import duckdb

    with _LOCK:
        pid = os.getpid()
        if pid not in _DATABASES:
            # a forked child's copy of the parent's database is left alone: not fork-safe
            con = duckdb.connect(":memory:", config={"enable_external_file_cache": False})
            con.execute("SET GLOBAL TimeZone = 'UTC'")  # parquet_metadata_cache: off already
            _DATABASES[pid] = con
        return _DATABASES[pid].cursor()
