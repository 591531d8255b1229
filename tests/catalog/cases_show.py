"""Bad inputs of `qparity show`: a run's metrics parts share one Parquet schema and are parsed
by one query (schemas.table_rows); a part whose footer is sound but whose pages are not
fails that query, and the error still names that part, not the first or the last."""

from __future__ import annotations

import io

from schemas.errors import ArtifactError
from schemas.table_digests import write_part
from tests.catalog.cases_files import _copied_run

BAD = "tables/metrics/convert.parquet"


def _part_with_broken_pages(env):
    """``show`` of a copy of the run whose convert metrics part (recorded with its new
    digest) has its first page header overwritten: the same schema, unreadable rows."""
    from rich.console import Console

    from qparity.views import show_run

    run = _copied_run(env)
    data = run.path(BAD).read_bytes()
    broken = data[:4] + b"\xff" * 16 + data[20:]
    write_part(run, BAD, lambda tmp: tmp.write_bytes(broken))
    show_run(Console(file=io.StringIO()), run.root.parent, run.run_id)


def cases() -> dict:
    return {
        "show: broken pages in one of the metrics parts": (_part_with_broken_pages,
                                                           ArtifactError, "convert.parquet"),
    }  # fmt: skip
