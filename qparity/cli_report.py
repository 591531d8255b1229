"""`qparity report`: one self-contained HTML file of a run (analysis/report.py).

Written to be registered on the main app as it is::

    app.command("report")(report_command)

Errors are :class:`~schemas.errors.QparityError` (e.g. no such run), printed by the main CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root

console = LazyConsole()

OutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="Where to write the HTML (default: <run>/report.html)."),
]


def report_command(
    run_id: Annotated[str, typer.Argument(help="A run id (see `qparity runs`).")],
    runs: RunsOpt = None,
    out: OutOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Write one self-contained HTML report of a run and print its path (--quiet: the
    same single line; accepted so every command takes it).

    Top-1 per stage, heatmaps of cosine and max_qscale_diff (layers x stages, the first
    divergent cell marked), sensitive ops, bad cases, links to the debug files.

    Example: qparity report RUN
    """
    from analysis.report import write_report  # heavy imports wait for the command
    from schemas.store import RunStore

    run = RunStore(store_root(runs)).open(run_id)
    path = write_report(run, out)
    if out is None:
        run.publish()  # the report lives in the run: upload it when the store is a URL
    console.print(str(path), highlight=False, soft_wrap=True)
