"""SQL over the run store: user SQL (read-only) and the named queries of ``analysis/sql``.

``run_sql`` answers ``qparity sql "SELECT ..."``: exactly one read statement (SELECT,
WITH ... SELECT, FROM ..., PIVOT, UNPIVOT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of a read, or an
informational PRAGMA such as ``PRAGMA table_info('runs')``), checked with DuckDB's own
parser before it runs, on the locked session of :mod:`analysis.sql_views`.

A named query is ``analysis/sql/<name>.sql``: one statement with ``$name`` parameters,
opened by a ``--`` comment header that says what it answers and which parameters it takes.
Values are always bound, never formatted into the SQL.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb

from analysis.query_limits import DEFAULT_TIMEOUT_S, TIMEOUT_ENV
from analysis.sql_views import connect, open_session
from schemas.errors import QueryError
from schemas.table_schemas import SCHEMAS

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
Fetch = Callable[["duckdb.DuckDBPyRelation | None"], T]
"""How a statement's result is taken from DuckDB (default: :func:`arrow_table`)."""
Parser = ModuleType | duckdb.DuckDBPyConnection
"""What parses SQL (``extract_statements``): the duckdb module or a connection."""

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "NamedQuery",
    "arrow_table",
    "connect",
    "execute",
    "execute_bounded",
    "load_query",
    "named",
    "query_names",
    "run_sql",
]

SQL_DIR = Path(__file__).resolve().parent / "sql"
"""Where the named queries live."""

_READ_ONLY_HINT = (
    "qparity sql is read-only: use one SELECT, WITH, PIVOT, UNPIVOT, DESCRIBE, SHOW or EXPLAIN"
)
_INFO_PRAGMAS = frozenset(
    {"table_info", "show", "show_tables", "show_tables_expanded", "database_size", "version"}
)
_PRAGMA_RE = re.compile(r"^\s*PRAGMA\s+(\w+)", re.IGNORECASE)
_EXPLAIN_RE = re.compile(r"^\s*EXPLAIN(\s+ANALYZE|\s*\([^)]*\))?\s+", re.IGNORECASE)
_CANCEL_WAIT_S = 10.0  # how long a cancelled query may take to stop
_FIRST_WORD_RE = re.compile(r"^\s*(\w+)")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def _statements(sql: str, parser: Parser) -> list[duckdb.Statement]:
    try:
        return parser.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(f"cannot parse the query: {e}", where="sql") from e


def _type_name(stmt: duckdb.Statement) -> str:
    return stmt.type.name if hasattr(stmt.type, "name") else str(stmt.type)


def check_read_only(sql: str, parser: Parser = duckdb) -> duckdb.Statement:
    """The one statement of ``sql`` if it only reads; else :class:`QueryError`.

    ``parser``: a connection whose database parses it (default: DuckDB's default
    connection, whose first use creates a database, ~25 ms)."""
    stmts = _statements(sql, parser)
    if len(stmts) != 1:
        raise QueryError(
            f"expected exactly one statement, got {len(stmts)}", where="sql", hint=_READ_ONLY_HINT
        )
    stmt = stmts[0]
    kind = _type_name(stmt)
    if kind == "SELECT":
        return stmt
    if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs its statement: check that one too
        check_read_only(_EXPLAIN_RE.sub("", stmt.query, count=1), parser)
        return stmt
    if kind == "MULTI":
        return _check_pivot(stmt, parser)
    if kind == "PRAGMA":
        m = _PRAGMA_RE.match(stmt.query)
        if m and m.group(1).lower() in _INFO_PRAGMAS:
            return stmt
        name = m.group(1) if m else "?"
        raise QueryError(
            f"PRAGMA {name} is not allowed (only {', '.join(sorted(_INFO_PRAGMAS))})",
            where="sql",
            hint=_READ_ONLY_HINT,
        )
    raise QueryError(f"{kind} statements are refused", where="sql", hint=_READ_ONLY_HINT)


def _check_pivot(stmt: duckdb.Statement, parser: Parser) -> duckdb.Statement:
    """A MULTI statement is what DuckDB makes of a PIVOT without an ``IN`` list: it first
    creates an enum type of the pivoted values, then runs the query. Allowed only when the
    whole statement is a query, i.e. it parses as the subquery of a SELECT (so
    ``CREATE TABLE t AS PIVOT ...``, ``COPY (PIVOT ...) TO`` and ``INSERT`` are refused)."""
    query = stmt.query.rstrip().rstrip(";")
    if _EXPLAIN_RE.match(query):
        check_read_only(_EXPLAIN_RE.sub("", query, count=1), parser)
        return stmt
    try:
        as_subquery = parser.extract_statements(f"SELECT * FROM (\n{query}\n)")
    except duckdb.Error:
        as_subquery = []
    if len(as_subquery) == 1:
        return stmt
    m = _FIRST_WORD_RE.match(query)
    word = m.group(1).upper() if m else "this"
    raise QueryError(
        f"{word} statements are refused (a PIVOT is allowed as a query only)",
        where="sql",
        hint=_READ_ONLY_HINT,
    )


def arrow_table(rel: duckdb.DuckDBPyRelation | None) -> pa.Table:
    """A statement's result as an Arrow table (no columns for a statement without one)."""
    import pyarrow as pa  # here: `qparity sql` prints DuckDB's rows (analysis.sql_rows)

    return pa.table({}) if rel is None else rel.to_arrow_table()


def execute(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: dict[str, Any] | None = None,
    fetch: Fetch[T] = arrow_table,
) -> T:
    """Run one statement with bound ``params`` on ``con``, its result taken by ``fetch``
    (an Arrow table); DuckDB errors become QueryError."""
    try:
        return fetch(con.sql(sql, params=params or None))
    except duckdb.Error as e:
        tables = ", ".join(SCHEMAS)
        raise QueryError(
            f"query failed: {e}",
            where="sql",
            hint=f"the views are {tables} and chain; `DESCRIBE <view>` lists its columns",
        ) from e


def run_sql(
    root: str | Path,
    sql: str,
    params: dict[str, Any] | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    fetch: Fetch[T] = arrow_table,
) -> T:
    """Run one read-only statement of user SQL over every run's tables under ``root``,
    cancelled past ``timeout_s`` seconds (None, 0 or inf: no limit) or on Ctrl-C; its
    result taken by ``fetch`` (an Arrow table)."""
    con = open_session()
    try:
        check_read_only(sql, con)  # parsed by the session's database: no second one
        limit = _wait_limit(timeout_s)
        connect(root, sql, con=con)
    except BaseException:
        con.close()
        raise
    return execute_bounded(con, sql, params, limit, close=True, fetch=fetch)


def execute_bounded(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: dict[str, Any] | None,
    timeout_s: float | None,
    close: bool = False,
    fetch: Fetch[T] = arrow_table,
) -> T:
    """:func:`execute` in a worker thread, stopped with DuckDB's ``interrupt()`` past
    ``timeout_s`` (a :class:`QueryError`) or on Ctrl-C (KeyboardInterrupt, raised again).
    With ``close`` the worker closes ``con`` when it ends: closing a connection a query
    still runs on blocks until that query ends, which a cancel that missed never does.

    The wait is in the calling thread, where Python delivers SIGINT, on an Event: a
    ``Thread.join`` interrupted by Ctrl-C marks a running thread as finished (Python 3.11).
    The thread is started inside the guarded block: ``Thread.start`` waits too, and a
    Ctrl-C landing there must cancel the query like one landing in the wait."""
    limit = _wait_limit(timeout_s)
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["table"] = execute(con, sql, params, fetch)
        except BaseException as e:  # handed to the waiting thread
            box["error"] = e
        finally:
            if close:
                con.close()
            done.set()

    try:
        threading.Thread(target=work, name="qparity-sql", daemon=True).start()
        finished = done.wait(limit)
    except KeyboardInterrupt:
        _cancel(con, done)
        raise
    if not finished:
        _cancel(con, done)
        raise QueryError(
            f"the query ran past the time limit of {timeout_s:g} s and was cancelled",
            where="sql",
            hint=f"narrow it (a WHERE, fewer joins) or raise the limit: --timeout SECONDS "
            f"or ${TIMEOUT_ENV} (0: no limit)",
        )
    if "error" in box:
        raise box["error"]
    return box["table"]


def _wait_limit(timeout_s: float | None) -> float | None:
    """The seconds to wait for a query: None (no limit) for None, 0, infinity or any limit
    past what a wait can take (``threading.TIMEOUT_MAX``, some 292 years): such a wait
    raised OverflowError after the query had started, and the worker it left running
    crashed the interpreter at exit. Not a number is a QueryError."""
    if timeout_s is not None and math.isnan(timeout_s):
        raise QueryError(
            "the time limit is not a number (nan)",
            where="sql",
            hint=f"give --timeout or ${TIMEOUT_ENV} in seconds (0: no limit)",
        )
    if not timeout_s or timeout_s >= threading.TIMEOUT_MAX:
        return None
    return timeout_s


def _cancel(con: duckdb.DuckDBPyConnection, done: threading.Event) -> None:
    """Interrupt until the worker is done: an interrupt that lands between two of the
    worker's DuckDB calls is lost (the next call then runs), so it is repeated."""
    deadline = time.monotonic() + _CANCEL_WAIT_S
    while time.monotonic() < deadline and not done.is_set():
        with contextlib.suppress(duckdb.ResourceInUseException, duckdb.ConnectionException):
            con.interrupt()  # refused while the worker is inside a connection call: retry
        if done.wait(0.05):
            return


@dataclass(frozen=True)
class NamedQuery:
    """A named query: its SQL, its header comment and the parameters it binds."""

    name: str
    sql: str
    doc: str
    params: frozenset[str]


@cache
def query_names() -> tuple[str, ...]:
    """The names of every query in analysis/sql, sorted."""
    return tuple(sorted(p.stem for p in SQL_DIR.glob("*.sql")))


@cache
def load_query(name: str) -> NamedQuery:
    """The named query ``name``; :class:`QueryError` listing the known names if none."""
    if not _NAME_RE.match(name) or name not in query_names():
        raise QueryError(
            f"no named query {name!r}",
            where=str(SQL_DIR),
            hint=f"use one of: {', '.join(query_names())}",
        )
    sql = (SQL_DIR / f"{name}.sql").read_text()
    stmt = check_read_only(sql)
    header = []
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        header.append(line[2:].strip())
    return NamedQuery(name, sql, "\n".join(header), frozenset(stmt.named_parameters))


def bind(query: NamedQuery, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` checked against the query's parameters (none missing, none unknown)."""
    missing = sorted(query.params - params.keys())
    unknown = sorted(params.keys() - query.params)
    if missing or unknown:
        what = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"
        needed = ", ".join(sorted(query.params)) or "none"
        raise QueryError(
            f"named query {query.name}: {what} parameter(s)",
            where=f"{query.name}.sql",
            hint=f"pass exactly its parameters: {needed}",
        )
    return params


def named(root: str | Path | duckdb.DuckDBPyConnection, name: str, **params: Any) -> pa.Table:
    """Run the named query ``name`` with bound ``params`` over the store ``root``.

    ``root`` may also be an open connection from :func:`connect`, to run several
    queries on one view of the store.
    """
    query = load_query(name)
    values = bind(query, params)
    if isinstance(root, duckdb.DuckDBPyConnection):
        return execute(root, query.sql, values)
    con = connect(root)
    try:
        return execute(con, query.sql, values)
    finally:
        con.close()
