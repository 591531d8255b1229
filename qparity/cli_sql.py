"""`qparity sql` and `qparity diff`: read-only SQL over every run, and what changed between two.

Written to be registered on the main app as they are::

    app.command("sql")(sql_command)
    app.command("diff")(diff_command)

Errors are :class:`~schemas.errors.QparityError` (QueryError), printed by the main CLI.
"""

from __future__ import annotations

import json
import sys
from datetime import date, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from analysis.query_limits import DEFAULT_TIMEOUT_S, TIMEOUT_ENV
from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console

    from analysis.sql_rows import Rows

out = LazyConsole()
err = LazyConsole(stderr=True)


class Format(StrEnum):
    """Output formats of `qparity sql`."""

    table = "table"
    csv = "csv"
    json = "json"


def _json_value(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return value


def write_result(
    result: Rows | pa.Table, fmt: str, console: Console = out, quiet: bool = False
) -> None:
    """Print ``result`` (DuckDB's rows or an Arrow table: analysis.sql_rows) as a rich
    table, CSV (with a header) or JSON (a list of objects); ``quiet``: CSV rows only, one
    line per row, whatever ``fmt``."""
    fmt = Format(fmt).value
    if fmt == "csv" or quiet:
        from analysis.sql_rows import csv_text

        sys.stdout.write(csv_text(result, header=not quiet))
    elif fmt == "json":
        rows = [{k: _json_value(v) for k, v in row.items()} for row in result.to_pylist()]
        sys.stdout.write(json.dumps(rows, indent=1, default=str) + "\n")
    else:
        from analysis.rich_tables import rich_table  # rich only for a table

        console.print(rich_table(result))
        console.print(f"{result.num_rows} row{'s' * (result.num_rows != 1)}", style="dim")


def sql_command(
    query: Annotated[
        str,
        typer.Argument(help="One read-only statement (SELECT, WITH, PIVOT, DESCRIBE...)."),
    ],
    root: RunsOpt = None,
    fmt: Annotated[
        Format, typer.Option("--format", "-f", help="table, csv or json.")
    ] = Format.table,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            envvar=TIMEOUT_ENV,
            min=0,
            metavar="SECONDS",
            help=f"Cancel the query after this many seconds (0 or inf: no limit; ${TIMEOUT_ENV}).",
        ),
    ] = DEFAULT_TIMEOUT_S,
    quiet: QuietOpt = False,
) -> None:
    """Read-only DuckDB SQL over every run's tables (one view per table, plus `chain`).

    Ctrl-C cancels a running query (exit code 130). --quiet: the rows as CSV without a
    header, one line per row.

    Example: qparity sql "SELECT run_id, stage FROM localization WHERE kind = 'stage' AND rank = 1"
    """
    try:
        from analysis.query import run_sql
        from analysis.sql_rows import fetch

        result = run_sql(store_root(root), query, timeout_s=timeout, fetch=fetch)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted:[/] the query was cancelled (Ctrl-C)", highlight=False)
        raise typer.Exit(130) from None
    write_result(result, fmt.value if isinstance(fmt, Format) else fmt, quiet=quiet)


def diff_command(
    a: Annotated[str, typer.Argument(help="The first run id (a).")],
    b: Annotated[str, typer.Argument(help="The second run id (b).")],
    root: RunsOpt = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Show every row, not only the ones that differ.")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """What changed between two runs: settings, stage artifacts, metrics, localization.

    --quiet: one line per section that differs ("metrics: 3 rows differ"), or "no difference".

    Example: qparity diff digits-cnn-20261129T120000-ab12cd digits-cnn-20261130T090000-ef34ab
    """
    from analysis.diff import changed_rows, diff_runs, render_diff

    diff = diff_runs(store_root(root), a, b)
    if not quiet:
        out.print(render_diff(diff, a, b, show_all=show_all))
        return
    counts = {s: changed_rows(s, t).num_rows for s, t in diff.items()}
    lines = [f"{s}: {n} row{'s' * (n != 1)} differ" for s, n in counts.items() if n]
    out.print("\n".join(lines) or "no difference", highlight=False, soft_wrap=True)
