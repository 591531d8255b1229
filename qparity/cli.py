"""The `qparity` command line: one surface for platform teams, engineers and analysts.

Errors print as one short paragraph (what, where, what to do) and exit 1; the traceback
only with --debug.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer

from qparity.cli_lazy import lazy_group
from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root
from schemas.errors import QparityError

LAZY_COMMANDS = {
    "sql": ("qparity.cli_sql", "sql_command"),
    "diff": ("qparity.cli_sql", "diff_command"),
    "report": ("qparity.cli_report", "report_command"),
    "sweep": ("qparity.cli_sweep", "sweep_command"),
    "schedule": ("qparity.cli_sweep", "schedule_command"),
    "verify": ("qparity.cli_verify", "verify_command"),
    "edit": ("qparity.cli_edit", "edit_command"),
    "ptq": ("qparity.cli_ptq", "ptq_command"),
    "gc": ("qparity.cli_gc", "gc_command"),
    "ops": ("qparity.cli_ops", "ops_command"),
}
"""The commands of the ``cli_*`` modules, listed after this module's own: each module is
imported, and its command built, only when the command is looked up (qparity.cli_lazy)."""

app = typer.Typer(
    cls=lazy_group(LAZY_COMMANDS, pretty_exceptions_short=True),
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find where a quantized model stops agreeing with itself, stage by stage.",
)
out = LazyConsole()
err = LazyConsole(stderr=True)
STATE = {"debug": False}
REPO = Path(__file__).resolve().parent.parent
DEMO_SPEC = REPO / "examples" / "digits" / "spec.yaml"


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False):
    STATE["debug"] = debug


@app.command()
def run(
    spec: Annotated[Path, typer.Argument(help="Pipeline spec (YAML).")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a spec field, e.g. --set quant.rounding=bpu_round"),
    ] = None,
    runs: RunsOpt = None,
    no_prefect: Annotated[
        bool, typer.Option("--no-prefect", help="Run the stages directly, without a Prefect flow.")
    ] = False,
    quiet: QuietOpt = False,
    pipeline: Annotated[
        str | None,
        typer.Option(
            "--pipeline",
            help="Start from a named pipeline of pipelines/named/ (qat_chain, to_convert, "
            "stages_only, analysis_only, ...), as the spec's `pipeline:` key would.",
        ),
    ] = None,
):
    """Run a pipeline spec; prints stages, times, cache hits and top-1.

    Example: qparity run examples/digits/spec.yaml --set quant.consistency_level=1
    Re-analyse the cached chain with new thresholds, computing no stage:
      qparity run examples/digits/spec.yaml --pipeline analysis_only --set compare.thresholds.cosine=0.9999
    """
    from qparity.views import run_spec

    run_spec(out, spec, set_ or [], store_root(runs), use_prefect=not no_prefect, quiet=quiet,
             pipeline=pipeline)  # fmt: skip


@app.command()
def demo(
    runs: RunsOpt = None,
    no_prefect: Annotated[bool, typer.Option("--no-prefect")] = False,
    quiet: QuietOpt = False,
):
    """The whole chain on the bundled digits example.

    Example: qparity demo
    """
    from qparity.views import run_spec

    run_spec(out, DEMO_SPEC, [], store_root(runs), use_prefect=not no_prefect, quiet=quiet)


@app.command("runs")
def list_runs(runs: RunsOpt = None, quiet: QuietOpt = False):
    """List the runs in the store, newest last (--quiet: run ids only, one per line).

    Example: qparity runs --runs ./runs
    """
    from schemas.owner import shown_status
    from schemas.store import RunStore

    if quiet:  # run ids hold no markup (fileio.validate_run_id): plain lines, no rich
        sys.stdout.write("".join(f"{m.run_id}\n" for m in RunStore(store_root(runs)).list_runs()))
        return
    from rich.table import Table

    table = Table("run_id", "status", "started_at", "stages", "tags")
    for m in RunStore(store_root(runs)).list_runs():
        done = sum(s.status == "complete" for s in m.stages.values())
        table.add_row(
            m.run_id,
            shown_status(m),  # a running run whose process died: interrupted
            m.started_at[:19],
            f"{done}/{len(m.stages)}",
            ",".join(f"{k}={v}" for k, v in m.tags.items()),
        )
    out.print(table)


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="A run id (see `qparity runs`).")],
    runs: RunsOpt = None,
    quiet: QuietOpt = False,
):
    """One run's stages and metrics (--quiet: one line, status and last top-1).

    Example: qparity show digits-cnn-20261129T120000-ab12cd
    """
    from qparity.views import show_line, show_run

    (show_line if quiet else show_run)(out, store_root(runs), run_id)


@app.command()
def localize(
    run_id: Annotated[str, typer.Argument(help="A run id (see `qparity runs`).")],
    runs: RunsOpt = None,
    quiet: QuietOpt = False,
):
    """Compare the run's stages; name the first divergent stage, layer and sensitive ops.

    Writes the tables layer_stats, badcases, layer_tensors, localization and sensitivity and
    the vendor-style files in the run's debug folder. --quiet: one line, the first
    divergent stage.

    Example: qparity localize digits-cnn-20261129T120000-ab12cd
    """
    from analysis.analyze import analyze
    from analysis.ptq_analysis import analyze_ptq, is_ptq_run
    from pipelines.ptq import load_ptq_spec
    from qparity.views import analysis_line, print_analysis
    from schemas.spec import load_spec
    from schemas.store import RunStore
    from stages.context import RunContext

    run = RunStore(store_root(runs)).open(run_id)
    if is_ptq_run(run):
        spec, _ = load_ptq_spec(run.path("spec.yaml"))
        result = analyze_ptq(run, spec)
    else:
        ctx = RunContext(spec=load_spec(run.path("spec.yaml")), run=run, code_version="")
        result = analyze(ctx)
    if quiet:
        out.print(analysis_line(run_id, result), highlight=False, soft_wrap=True)
    else:
        print_analysis(out, result)


@app.command()
def rerun(
    run_id: Annotated[str, typer.Argument(help="The run to start from (see `qparity runs`).")],
    stage: Annotated[str, typer.Option("--stage", help="The stage to recompute, e.g. convert.")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Override a spec field, e.g. --set stages.convert.multiplier_bits=31"
        ),
    ] = None,
    downstream: Annotated[
        bool, typer.Option("--downstream", help="Also run every stage after it.")
    ] = False,
    runs: RunsOpt = None,
    no_prefect: Annotated[bool, typer.Option("--no-prefect")] = False,
    quiet: QuietOpt = False,
):
    """Recompute one stage of a run from its cached upstream, then re-localize (--quiet:
    one line, the new run and its first divergent stage).

    Example: qparity rerun digits-cnn-20261129T120000-ab12cd --stage convert --set stages.convert.multiplier_bits=31
    """
    from qparity.views import rerun_view

    rerun_view(out, store_root(runs), run_id, stage, set_ or [], downstream, not no_prefect,
               quiet=quiet)  # fmt: skip


def _is_usage_error(e: Exception) -> bool:
    """A click usage error (missing argument, bad option), from click or typer's own copy
    of it (typer 0.29 raises ``typer._click`` exceptions, not ``click``'s)."""
    import click

    return isinstance(e, click.ClickException) or (
        callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int)
    )


def _show_warning(message, category, *args, **kwargs) -> None:
    """Store warnings (a refused symlink) as one line on stderr; others as Python prints them."""
    from schemas.store_layout import StoreWarning

    if issubclass(category, StoreWarning):
        err.print(f"[bold yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
    else:
        _PYTHON_SHOWWARNING(message, category, *args, **kwargs)


_PYTHON_SHOWWARNING = warnings.showwarning


def main() -> None:
    """Console entry point: our errors become one paragraph and exit code 1."""
    warnings.showwarning = _show_warning
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:  # a typer.Exit(n), or 130 after Ctrl-C
            sys.exit(code)
    except QparityError as e:
        if STATE["debug"]:
            raise
        err.print(f"[bold red]error:[/] {e.message}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except (typer.Exit, SystemExit) as e:
        sys.exit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except Exception as e:  # click usage errors and anything unexpected
        if _is_usage_error(e):
            e.show()
            sys.exit(e.exit_code)
        if STATE["debug"]:
            raise
        err.print(
            f"[bold red]internal error:[/] {type(e).__name__}: {e}. "
            "Rerun with --debug for the traceback and report it.",
            highlight=False,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
