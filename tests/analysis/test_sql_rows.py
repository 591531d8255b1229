"""DuckDB's rows print exactly as the Arrow table of the same result did (every format of
``qparity sql``); results of other types are still fetched as Arrow."""

from __future__ import annotations

import io
import struct

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from analysis.query import arrow_table
from analysis.sql_rows import Rows, csv_text, double_text, fetch
from qparity.cli_sql import write_result

EVERY_PLAIN_TYPE = """SELECT * FROM (VALUES
 ('a"b,c', true, 0.1, TIMESTAMPTZ '2026-01-01 00:00:00.5+00', -5::TINYINT, 300::SMALLINT,
  3::INTEGER, 9223372036854775807, 255::UTINYINT, 65535::USMALLINT, 4294967295::UINTEGER,
  18446744073709551615::UBIGINT, 'x'),
 (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 ('', false, 'nan'::DOUBLE, TIMESTAMPTZ '0900-05-01 23:59:59.000001+00', 0, 0, 0, -1, 0, 0, 0,
  0, 'line
 break é'),
 ('0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', true, -1e-7, NULL, 1, 1,
  1, 1, 1, 1, 1, 1, '-'),
 ('q', false, 'inf'::DOUBLE, TIMESTAMPTZ '2026-06-01 12:34:56.123456+02', 1, 1, 1, 1, 1, 1,
  1, 1, 'q'),
 ('q', false, 1e22, TIMESTAMPTZ '1970-01-01 00:00:00+00', 1, 1, 1, 1, 1, 1, 1, 1, 'q'),
 ('q', false, 123456.789, NULL, 1, 1, 1, 1, 1, 1, 1, 1, 'q')
) t("s", "b", "d", "ts", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "a ""q"" b")"""


@pytest.fixture
def con():
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")  # as analysis.sql_views.connect
    yield con
    con.close()


def _printed(result, fmt, quiet, capsys) -> str:
    console = Console(file=io.StringIO(), width=240)
    write_result(result, fmt, console=console, quiet=quiet)
    return capsys.readouterr().out + console.file.getvalue()


@pytest.mark.parametrize(
    "sql",
    [
        EVERY_PLAIN_TYPE,
        "SELECT 1 AS a, 'x' AS a",  # a repeated name
        "SELECT NULL::VARCHAR AS only_null",
        "SELECT 1 AS a WHERE false",
        "DESCRIBE SELECT 1 AS a",
    ],
)
def test_rows_print_as_the_arrow_table_did(con, sql, capsys):
    rows, arrow = fetch(con.sql(sql)), arrow_table(con.sql(sql))
    assert isinstance(rows, Rows)
    for fmt, quiet in (("csv", False), ("csv", True), ("json", False), ("table", False)):
        assert _printed(rows, fmt, quiet, capsys) == _printed(arrow, fmt, quiet, capsys), fmt


def test_a_result_without_columns_prints_nothing(capsys):
    assert csv_text(Rows([], [], [])) == csv_text(pa.table({})) == ""
    assert _printed(fetch(None), "json", False, capsys) == "[]\n"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT [1.5, 2.0]::FLOAT[] AS values",
        "SELECT sum(n) AS s FROM (VALUES (1::BIGINT)) t(n)",  # a HUGEINT
        "SELECT 1.5::DECIMAL(4, 2) AS d, DATE '2026-01-02' AS day",
        "SELECT 0.5::FLOAT AS f",
        "SELECT TIMESTAMPTZ 'infinity' AS t",  # no Python datetime: fetched again as Arrow
    ],
)
def test_other_results_are_arrow_tables(con, sql):
    assert isinstance(fetch(con.sql(sql)), pa.Table)


def _arrow_csv(values: list[float]) -> list[str]:
    table = pa.table({"x": pa.array(values, pa.float64())})
    return csv_text(table, header=False).splitlines()


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=40))
def test_doubles_are_written_as_arrow_writes_them(values):
    assert [double_text(v) for v in values] == _arrow_csv(values)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40))
def test_doubles_of_any_bit_pattern_are_written_as_arrow_writes_them(bits):
    values = [struct.unpack("<d", struct.pack("<Q", b))[0] for b in bits]
    assert [double_text(v) for v in values] == _arrow_csv(values)


def test_doubles_at_the_notation_boundaries():
    edges = [1e-6, 9.99e-7, 1e-7, 1.5e-6, 999999999.9, 1e9, 1e10, 12345678901.0, 0.0, -0.0, 5e-324]
    assert [double_text(v) for v in edges] == _arrow_csv(edges)
