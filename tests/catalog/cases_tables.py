"""Table parts changed after the run wrote them, for the catalog (test_bad_inputs.py).

Every case works on a scratch copy of the catalog's complete run (cases_files._copied_run):
a valid Parquet part with a changed value, a part the run never wrote, a deleted part.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.errors import ArtifactError
from tests.catalog.cases_files import _copied_run

PART = "tables/metrics/calibrate.parquet"


def _read(env, edit):
    from schemas.tables import read_run_table

    run = _copied_run(env)
    edit(run.path(PART))
    return read_run_table(run, "metrics")


def _changed_value(path):
    rows = pq.read_table(path).to_pylist()
    rows[0]["value"] = 1.0 - rows[0]["value"]
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)


def _added_part(path):
    pq.write_table(pq.read_table(path), path.with_name("extra.parquet"))


def cases() -> dict:
    return {
        "parquet part with a changed value": (lambda e: _read(e, _changed_value), ArtifactError,
                                              "calibrate.parquet"),
        "parquet part the run never wrote": (lambda e: _read(e, _added_part), ArtifactError,
                                             "extra.parquet"),
        "parquet part deleted": (lambda e: _read(e, lambda p: p.unlink()), ArtifactError,
                                 "calibrate.parquet"),
    }  # fmt: skip
