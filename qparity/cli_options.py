"""Options shared by the commands: where the run store is, and ``--quiet``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

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


class LazyConsole:
    """A rich Console made on first use: a command that prints no table and no error
    (``runs -q``, ``sql -q``) starts without importing rich (~20 ms; bench/cli.py). It
    stands in for the Console everywhere (rich's own Live and Progress use it as a context
    manager too); to change the Console itself, change :meth:`real`'s."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def real(self) -> Console:
        """The Console, made now if it was not yet."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def __enter__(self) -> Console:
        return self.real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.real().__exit__(*exc)
