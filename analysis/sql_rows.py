"""A statement's result as DuckDB's Python rows, printed as it was from Arrow: what
``qparity sql`` prints without importing pyarrow (0.16 s of its start-up, bench/cli.py).

:func:`fetch` takes the rows only when every column has a type of :data:`PLAIN`; for those
the rows hold the values pyarrow's ``to_pylist`` gives (so the JSON and the rich table are
unchanged) and :func:`csv_text` writes what ``pyarrow.csv.write_csv`` writes
(tests/analysis/test_sql_rows.py compares both on each type and on random doubles). Any
other result (a list, a HUGEINT sum, a DECIMAL, a date...) is fetched as an Arrow table and
printed through pyarrow, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

TIMESTAMPTZ = "TIMESTAMP WITH TIME ZONE"
INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
            "UBIGINT")  # fmt: skip
PLAIN = frozenset({"VARCHAR", "BOOLEAN", "DOUBLE", TIMESTAMPTZ, *INTEGERS})
"""Column types (as DuckDB names them) whose rows are printed without pyarrow."""


@dataclass(frozen=True)
class Rows:
    """A result as DuckDB's rows, with the part of an Arrow table's interface the printers
    use (``column_names``, ``num_rows``, ``to_pylist``)."""

    column_names: list[str]
    types: list[str]
    rows: list[tuple]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def to_pylist(self) -> list[dict[str, Any]]:
        return [dict(zip(self.column_names, row, strict=True)) for row in self.rows]


def fetch(rel: duckdb.DuckDBPyRelation | None) -> Rows | pa.Table:
    """The result of ``rel`` as :class:`Rows` when every column is :data:`PLAIN`, else as
    an Arrow table (:func:`analysis.query.arrow_table`). A TIMESTAMPTZ outside the years
    1-9999 (or infinite) is not a Python datetime DuckDB can give: that result is fetched
    again as Arrow (the statement runs twice; only then)."""
    if rel is None:
        return Rows([], [], [])
    types = [str(t) for t in rel.types]
    if all(t in PLAIN for t in types):
        rows = rel.fetchall()
        stamps = [i for i, t in enumerate(types) if t == TIMESTAMPTZ]
        if all(_aware(row[i]) for row in rows for i in stamps):
            return Rows(list(rel.columns), types, rows)
    from analysis.query import arrow_table

    return arrow_table(rel)


def _aware(value: Any) -> bool:
    return value is None or (isinstance(value, datetime) and value.tzinfo is not None)


def csv_text(result: Rows | pa.Table, header: bool = True) -> str:
    """``result`` as CSV: strings quoted, NULL empty, as ``pyarrow.csv.write_csv`` writes."""
    if not isinstance(result, Rows):
        import pyarrow as pa
        import pyarrow.csv as pacsv

        sink = pa.BufferOutputStream()
        pacsv.write_csv(result, sink, pacsv.WriteOptions(include_header=header))
        return sink.getvalue().to_pybytes().decode()
    cells = [_CELL.get(t, str) for t in result.types]
    lines = [",".join(map(_quoted, result.column_names))] if header and result.column_names else []
    lines += [
        ",".join("" if v is None else cell(v) for cell, v in zip(cells, row, strict=True))
        for row in result.rows
    ]
    return "".join(f"{line}\n" for line in lines)


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _timestamp(value: datetime) -> str:
    utc = value.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(" ", "microseconds") + "Z"


def double_text(x: float) -> str:
    """``x`` as Arrow writes a double: the shortest digits that read back as ``x`` (Python's
    ``repr`` finds the same ones), in decimal notation for decimal exponents -6 to 9, else
    as ``1.5e-7`` / ``1e+20``; ``nan``, ``inf``, ``-inf``, ``-0``."""
    if math.isnan(x) or math.isinf(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return f"{sign}0"
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + int(exp or 0) - (len(whole + frac) - len(digits))  # digits before "."
    digits = digits.rstrip("0")
    if not -6 <= point - 1 < 10:
        rest = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{rest}e{'+' if point > 0 else '-'}{abs(point - 1)}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


_CELL = {
    "VARCHAR": _quoted,
    "BOOLEAN": lambda v: "true" if v else "false",
    "DOUBLE": double_text,
    TIMESTAMPTZ: _timestamp,
}
"""How a non-NULL value of each PLAIN type is written (the integers: ``str``)."""
