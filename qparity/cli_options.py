"""Options shared by the commands: where the run store is."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

RunsOpt = Annotated[
    str | None,
    typer.Option(
        "--runs",
        help="Run store: a folder or an fsspec URL such as s3://bucket/runs "
        "(default: $QPARITY_RUNS or ./runs).",
    ),
]


def store_root(runs: str | None) -> str | Path:
    """The store named by ``--runs``, else the default one."""
    from pipelines.runs import default_store_root

    return runs or default_store_root()
