"""The Parquet writer and reader of the tables SQL sees (their columns:
:mod:`schemas.table_schemas`).

Each run writes its rows under ``<run>/tables/<table>/<part>.parquet``, so that
``read_parquet('<root>/*/tables/<table>/**/*.parquet')`` sees every run. Column names
are the contract of docs/design.md "Tables": add columns, never rename them. A table is added
by adding its schema to :data:`schemas.table_schemas.SCHEMAS`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.errors import ArtifactError
from schemas.store import Run
from schemas.store_layout import run_folders
from schemas.table_digests import check_table, write_part
from schemas.table_rows import CORRUPT_HINT, verified_parts
from schemas.table_rows import read_run_table as read_run_table  # its home: the DuckDB reader
from schemas.table_schemas import SCHEMAS

_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]*$")


def _schema(table: str) -> pa.Schema:
    if table not in SCHEMAS:
        raise ArtifactError(f"unknown table {table!r}", hint=f"use one of: {', '.join(SCHEMAS)}")
    return SCHEMAS[table].arrow


def _python_types(dtype: pa.DataType) -> tuple[type, ...]:
    if pa.types.is_boolean(dtype):
        return (bool,)
    if pa.types.is_integer(dtype):
        return (int,)
    if pa.types.is_floating(dtype):
        return (int, float)
    return (str,)


def _check_value(value: Any, dtype: pa.DataType) -> Any:
    """The value to store for ``dtype``; raises TypeError if it has the wrong type."""
    if pa.types.is_timestamp(dtype):
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if not isinstance(value, datetime):
            raise TypeError("expected a datetime or an ISO-8601 string")
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if pa.types.is_list(dtype):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError("expected a list")
        return [_check_value(v, dtype.value_type) for v in value]
    expected = _python_types(dtype)
    if (isinstance(value, bool) and bool not in expected) or not isinstance(value, expected):
        raise TypeError(f"expected {' or '.join(t.__name__ for t in expected)}")
    return value


def _column(table: str, field: pa.Field, rows: list[dict[str, Any]]) -> pa.Array:
    values = []
    for i, row in enumerate(rows):
        value = row[field.name]
        if value is None and not field.nullable:
            raise ArtifactError(f"table {table}, column {field.name}: row {i} is null")
        try:
            values.append(None if value is None else _check_value(value, field.type))
        except (TypeError, ValueError) as e:
            msg = f"table {table}, column {field.name}: row {i} has {value!r}: {e}"
            raise ArtifactError(msg) from e
    return pa.array(values, type=field.type)


def to_arrow(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    """Validate ``rows`` against the table's schema and build an Arrow table."""
    schema = _schema(table)
    names = set(schema.names)
    for i, row in enumerate(rows):
        missing, extra = names - row.keys(), row.keys() - names
        if missing or extra:
            what = (
                f"missing column {sorted(missing)[0]}"
                if missing
                else f"unknown column {sorted(extra)[0]}"
            )
            raise ArtifactError(
                f"table {table}: row {i}: {what}", hint=f"columns: {', '.join(schema.names)}"
            )
    return pa.Table.from_arrays([_column(table, f, rows) for f in schema], schema=schema)


def write_rows(run: Run, table: str, rows: list[dict[str, Any]], part: str) -> Path:
    """Write ``rows`` to ``tables/<table>/<part>.parquet`` atomically (replacing that part)."""
    return _write(run, table, to_arrow(table, rows), part)


def _check_part(part: str) -> None:
    if not all(_PART_RE.match(p) and ".." not in p for p in part.split("/")):
        raise ArtifactError(
            f"invalid part name {part!r}", hint="use letters, digits, '.', '_', '-', '='"
        )


def _write(run: Run, table: str, data: pa.Table, part: str) -> Path:
    """Write the part atomically; its sha256 goes into the manifest (schemas.table_digests)."""
    _check_part(part)
    return write_part(
        run, f"tables/{table}/{part}.parquet", lambda tmp: pq.write_table(data, str(tmp))
    )


def write_columns(run: Run, table: str, columns: dict[str, Any], part: str) -> Path:
    """Like :func:`write_rows` for bulk rows given column-wise (lists or numpy arrays)."""
    schema = _schema(table)
    if set(columns) != set(schema.names):
        missing, extra = set(schema.names) - set(columns), set(columns) - set(schema.names)
        raise ArtifactError(
            f"table {table}: missing columns {sorted(missing)}, unknown {sorted(extra)}",
            hint=f"columns: {', '.join(schema.names)}",
        )
    try:
        arrays = [_array(columns[f.name], f.type) for f in schema]
        data = pa.Table.from_arrays(arrays, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as e:
        raise ArtifactError(f"table {table}: {e}") from e
    return _write(run, table, data, part)


def _array(values: Any, dtype: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of ``dtype`` (an Arrow array of that type as it is)."""
    if isinstance(values, pa.Array) and values.type == dtype:
        return values
    return pa.array(values, type=dtype)


def read_table(root: str | Path, table: str) -> pa.Table:
    """Every run's rows of ``table`` under the store ``root``, via DuckDB; every part is
    checked against its run's manifest first (:func:`schemas.table_digests.check_table`)."""
    import duckdb  # here: `qparity show` reads parts without it (bench/cli.py)

    schema = _schema(table)
    root = Path(root)
    files = [str(f) for run in run_folders(root) for f in check_table(run, table)]
    if not files:
        return schema.empty_table()
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        query = "SELECT * FROM read_parquet($files, union_by_name = true)"
        result = con.sql(query, params={"files": files}).to_arrow_table()
    except duckdb.Error as e:
        raise ArtifactError(f"cannot read table {table} ({e})", where=str(root)) from e
    finally:
        con.close()
    return _conform(result, schema)


def _conform(result: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast the schema's columns back to their types; keep any extra columns after them."""
    columns = [result.column(f.name).cast(f.type) for f in schema]
    fields = list(schema.with_metadata(None))
    for name in result.column_names:
        if name not in schema.names:
            columns.append(result.column(name))
            fields.append(result.schema.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _read_part(source, schema: pa.Schema) -> pa.Table:
    """One part (a path or a buffer), its columns of ``schema`` cast to their types
    (ArrowInvalid if a required column is missing or a column does not cast: a part of
    another table)."""
    part = pq.ParquetFile(source).read()  # read_table would import pyarrow.dataset
    for field in schema:
        if field.name not in part.column_names:
            if not field.nullable:
                raise pa.ArrowInvalid(f"required column {field.name} is missing")
            continue
        i = part.schema.get_field_index(field.name)
        column = part.column(i)  # cast only if needed: a cast imports pyarrow.compute
        part = part.set_column(
            i, field, column if column.type == field.type else column.cast(field.type)
        )
    return part


def read_run_arrow(run: Run, table: str) -> pa.Table | None:
    """:func:`read_run_table` as one Arrow table, parsed by pyarrow (None if the run has
    no part of it): for columnar readers of large tables (``stage_outputs``)."""
    schema = _schema(table)
    parts = []
    for f, data in verified_parts(run, table):
        try:
            parts.append(_read_part(pa.BufferReader(data), schema))
        except (OSError, pa.ArrowException) as e:
            raise ArtifactError(
                f"cannot read Parquet file of table {table} ({e})", where=str(f), hint=CORRUPT_HINT
            ) from e
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="default")


def float32_lists(tensors: list[np.ndarray]) -> pa.ListArray:
    """One Arrow ``list<float32>`` row per tensor (flattened), built from one buffer."""
    sizes = np.fromiter((t.size for t in tensors), dtype=np.int32, count=len(tensors))
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int32)
    # one float32 buffer, which Arrow takes without a copy (ResNet-50@224: 100 MB a sample)
    flat = (
        np.concatenate([t.reshape(-1) for t in tensors], dtype=np.float32)
        if tensors
        else np.zeros(0, np.float32)
    )
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
