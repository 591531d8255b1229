"""A result table as a rich table: what ``qparity sql`` and ``qparity diff`` print.

Its own module so that ``qparity sql`` prints without importing :mod:`analysis.diff` (and
the spec models it loads): the data commands start fast (bench/cli.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.table import Table

if TYPE_CHECKING:
    import pyarrow as pa

    from analysis.sql_rows import Rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a sha256: the prefix is enough to tell them apart
    return str(value)


def rich_table(
    table: pa.Table | Rows, title: str | None = None, max_rows: int | None = None
) -> Table:
    """An Arrow table (or DuckDB's rows: analysis.sql_rows) as a rich table (NULL as '-',
    floats to 6 digits, digests shortened)."""
    out = Table(*table.column_names, title=title, title_justify="left")
    rows = table.to_pylist()
    for row in rows[:max_rows]:
        out.add_row(*(_cell(v) for v in row.values()))
    if max_rows is not None and len(rows) > max_rows:
        out.caption = f"{len(rows) - max_rows} more rows not shown"
    return out
