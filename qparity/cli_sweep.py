"""`qparity sweep` and `qparity schedule`: matrices of runs, and nightly deployments of them.

Written to be registered on the main app as they are::

    app.command("sweep")(sweep_command)
    app.command("schedule")(schedule_command)

Errors are :class:`~schemas.errors.QparityError` (SpecError for a bad sweep file or cron
string), printed by the main CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root

out = LazyConsole()


def sweep_command(
    sweep: Annotated[Path, typer.Argument(help="Sweep file (YAML): spec, matrix, runner.")],
    runs: RunsOpt = None,
    no_prefect: Annotated[
        bool,
        typer.Option("--no-prefect", help="Run every run here, one by one, without Prefect."),
    ] = False,
    quiet: QuietOpt = False,
):
    """Run a matrix of spec fields, one run per combination; a line as each run ends, then
    a summary table (--quiet: only one line per run, at the end).

    One failing run does not stop the others; the command exits 1 if any run failed.

    Example: qparity sweep pipelines/sweeps/digits_levels.yaml

    Example: qparity sweep pipelines/sweeps/digits_levels.yaml --no-prefect --runs /tmp/runs
    """
    from pipelines.sweep import expand, load_sweep, run_sweep

    n = len(expand(load_sweep(sweep), "preview"))
    if not quiet:
        out.print(f"[bold]{sweep}[/]: {n} runs into {store_root(runs)}/", highlight=False)
    ended: list[int] = []

    def on_run(record) -> None:
        ended.append(1)
        out.print(f"  [{len(ended)}/{n}] {record.line()}", highlight=False, soft_wrap=True)

    result = run_sweep(sweep, store_root(runs), not no_prefect, None if quiet else on_run)
    for record in result.runs if quiet else []:
        out.print(record.line(), highlight=False, soft_wrap=True)
    if not quiet:
        out.print(result.table())
    if result.failed:
        if not quiet:
            out.print(
                f"{len(result.failed)} of {len(result.runs)} runs failed; "
                "details: qparity show RUN_ID",
                highlight=False,
            )
        raise typer.Exit(1)


def schedule_command(
    sweep: Annotated[Path, typer.Argument(help="Sweep file (YAML).")],
    cron: Annotated[str, typer.Option("--cron", help='Cron schedule, e.g. "0 2 * * *".')],
    runs: RunsOpt = None,
    timezone: Annotated[
        str,
        typer.Option(
            "--timezone", help="IANA time zone the cron fields are read in, e.g. Europe/Berlin."
        ),
    ] = "UTC",
    quiet: QuietOpt = False,
):
    """Register a Prefect deployment that runs the sweep on a cron schedule.

    Needs a Prefect server (`prefect server start`, PREFECT_API_URL set) and a worker
    (`prefect worker start --pool qparity`) to execute the scheduled runs. --quiet prints
    only the deployment's name.

    Example: qparity schedule pipelines/sweeps/digits_levels.yaml --cron "0 2 * * *" --timezone Europe/Berlin
    """
    from pipelines.schedule import schedule

    d = schedule(sweep, cron, store_root(runs), timezone=timezone)
    if quiet:
        out.print(d.name, highlight=False, soft_wrap=True)
        return
    ui = d.api_url.removesuffix("/api")
    out.print(
        f"deployment [bold]{d.name}[/] ({d.id}) scheduled {d.cron!r} ({d.timezone}) "
        f"in work pool {d.work_pool}\n"
        f"  runs execute while a worker is up:  prefect worker start --pool {d.work_pool}\n"
        f"  run it now:                         prefect deployment run '{d.name}'\n"
        f"  in the UI:                          {ui}/deployments/deployment/{d.id}",
        highlight=False,
    )
