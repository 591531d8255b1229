"""Options shared by the commands: where the run store is, and ``--quiet``."""

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

QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="No progress, no tables: one line per result (for cron and scripts)."
    ),
]


def store_root(runs: str | None) -> str | Path:
    """The store named by ``--runs``, else the default one; a local one that is a file is
    an ArtifactError here, before any work starts."""
    from schemas.remote import default_store_root, is_url, local_root
    from schemas.store_layout import check_root

    root = runs or default_store_root()
    if not is_url(root):
        check_root(local_root(root))
    return root
