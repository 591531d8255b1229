"""What the CLI prints: chain progress tables and a run's summary."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from analysis.primary import run_primary
from schemas.owner import as_shown
from schemas.stage_names import STAGE_NAMES
from schemas.store import RunStore
from schemas.table_rows import read_run_table


def run_spec(
    out: Console,
    spec_path: Path,
    overrides: list[str],
    store_root: str | Path,
    *,
    use_prefect: bool = True,
    quiet: bool = False,
    pipeline: str | None = None,
) -> str:
    """Load, run and summarise a spec (starting from the named ``pipeline`` when given);
    returns the run id. ``quiet``: one line (for cron)."""
    from pipelines.flow import run_chain
    from schemas.spec import load_spec, with_overrides

    spec = load_spec(spec_path, pipeline)
    spec = with_overrides(spec, overrides) if overrides else spec
    if not quiet:
        out.print(f"[bold]{spec.name}[/]: run store {store_root}/", highlight=False)
    with progress(out, quiet) as on_stage:
        result = run_chain(
            spec,
            Path(spec_path).read_text(),
            store_root,
            use_prefect=use_prefect,
            on_stage=on_stage,
        )
    if quiet:
        out.print(f"{result.run_id} complete, {_divergence(result.analysis)}", highlight=False)
    else:
        _finish_view(out, store_root, result)
    return result.run_id


@contextmanager
def progress(out: Console, quiet: bool):
    """A rich progress display of stages and of the batches inside them; yields on_stage."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from stages.progress import listening

    if quiet:
        yield None
        return
    bars = Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
                    console=out, transient=True)  # fmt: skip
    tasks: dict[str, int] = {}

    def on_tick(task: str, done: int, total: int) -> None:
        if task not in tasks:
            tasks[task] = bars.add_task(task, total=total)
        bars.update(tasks[task], completed=done, total=total)

    def on_stage(name, outcome) -> None:
        for t in tasks.values():
            bars.remove_task(t)
        tasks.clear()
        hit = "cache hit" if outcome.cache_hit else "computed"
        bars.console.print(f"  {name:<10} {outcome.duration_s:7.2f} s  {hit}", highlight=False)

    with bars, listening(on_tick):
        yield on_stage


def _finish_view(out: Console, store_root: str | Path, result) -> None:
    out.print(stage_table(store_root, result.run_id))
    print_islands(out, RunStore(store_root).open(result.run_id))
    print_faults(out, RunStore(store_root).open(result.run_id))
    if result.analysis is not None:
        print_analysis(out, result.analysis)
    for step, path in result.steps.items():
        out.print(f"{step}: {path}", highlight=False, soft_wrap=True)
    startup = (
        f" (+{result.prefect_startup_s:.1f} s Prefect API start-up)"
        if result.prefect_startup_s > 0.5
        else ""
    )
    out.print(
        f"run {result.run_id} complete in {result.wall_s:.1f} s{startup}; "
        f"details: qparity show {result.run_id}",
        highlight=False,
    )


def stage_table(store_root: str | Path, run_id: str, metrics: list[dict] | None = None) -> Table:
    """Stages of a run with duration, cache hit and the primary metric (top1 with labels,
    else cosine, or compare.primary; from the run's tables, or its ``metrics`` rows)."""
    run = RunStore(store_root).open(run_id)
    m = as_shown(run.manifest())
    return _stage_table(m, run_primary(run, metrics=metrics, manifest=m))


def _stage_table(m, primary) -> Table:
    """The stage table of the shown manifest ``m`` with the run's ``primary`` metric."""
    values = primary.values
    table = Table("stage", "status", "duration_s", "cache", primary.name, title=f"run {m.run_id}")
    if "float" in values:
        table.add_row("float", "-", "-", "-", f"{values['float']:.4f}")
    for name, rec in _in_chain_order(m.stages):
        table.add_row(
            name,
            rec.status,
            f"{rec.duration_s or 0:.2f}",
            "hit" if rec.cache_hit else "-",
            f"{values[name]:.4f}" if name in values else "-",
        )
    return table


def _in_chain_order(stages: dict) -> list:
    """A manifest's (stage, record) pairs in chain order; PTQ stages after, by start time."""
    order = {name: i for i, name in enumerate(STAGE_NAMES)}
    return sorted(stages.items(), key=lambda kv: (order.get(kv[0], 99), kv[1].started_at))


def show_run(out: Console, store_root: str | Path, run_id: str) -> None:
    """Print a run's header, stage table and every metric."""
    run = RunStore(store_root).open(run_id)
    m = as_shown(run.manifest())  # a running run whose process died: interrupted
    out.print(
        f"[bold]{m.run_id}[/]  status={m.status}  started={m.started_at[:19]}  "
        f"spec={m.spec_digest[:12]}  code={m.code_version}",
        highlight=False,
    )
    if m.error:
        out.print(f"[red]error:[/] {m.error}", highlight=False)
    metrics = read_run_table(run, "metrics")  # read once: the stage table's and this one's
    out.print(_stage_table(m, run_primary(run, metrics=metrics, manifest=m)))
    print_islands(out, run, metrics)
    print_faults(out, run)
    table = Table("stage", "metric", "output", "value", "n_samples", title="metrics")
    for r in metrics:
        output = r.get("output") or "-"
        table.add_row(r["stage"], r["metric"], output, f"{r['value']:.6g}", str(r["n_samples"]))
    out.print(table)


def print_faults(out: Console, run) -> None:
    """The run's injected faults, if any, each saying whether it changed anything."""
    rows = read_run_table(run, "faults")
    if not rows:
        return
    table = Table("stage", "layer", "kind", "amount", "effect", title="injected faults")
    for r in rows:
        effect = "changed" if r.get("changed") else "CHANGED NOTHING"
        if r.get("changed") is None:  # a run from before the column
            effect = "not recorded"
        reason = f": {r['reason']}" if r.get("reason") else ""
        table.add_row(r["stage"], r["layer_id"], r["kind"], f"{r['amount']:g}", effect + reason)
    out.print(table)


def print_islands(out: Console, run, metrics: list[dict] | None = None) -> None:
    """The float islands convert left (listed in model_check_result.txt too), if any:
    ops with no integer form, which run on the board's CPU side. ``metrics``: the run's
    metrics rows, if read already: when their ``float_islands`` count is 0 the convert
    artifact (and the artifact models) are not loaded."""
    if not run.path("artifacts/convert.json").exists():
        return
    counts = [r["value"] for r in metrics or () if r["metric"] == "float_islands"
              and r["stage"] == "convert"]  # fmt: skip
    if counts and not any(counts):
        return
    from schemas.artifacts import QuantizedModel

    islands = run.load_artifact("convert", QuantizedModel).float_ops
    if islands:
        out.print(f"float islands (run on the board's CPU side): {', '.join(islands)}",
                  highlight=False)  # fmt: skip


def _divergence(analysis) -> str:
    first = analysis.first if analysis else None
    return f"first divergent stage {first.analysis}" if first else "no divergence"


def analysis_line(run_id: str, analysis) -> str:
    """One line for ``localize --quiet``: the run and its first divergent stage and layer."""
    first = analysis.first
    layer = f", layer {first.first_layer}" if first is not None and first.first_layer else ""
    return f"{run_id} {_divergence(analysis)}{layer}"


def show_line(out: Console, store_root: str | Path, run_id: str) -> None:
    """``show --quiet``: run id, status, the last stage that ran and its primary metric."""
    run = RunStore(store_root).open(run_id)
    m = as_shown(run.manifest())
    primary = run_primary(run, manifest=m)
    ran = [name for name, _ in _in_chain_order(m.stages) if name in primary.values]
    last = f"{ran[-1]} {primary.name} {primary.values[ran[-1]]:.4f}" if ran else "no metric"
    out.print(f"{m.run_id} {m.status} {last}", highlight=False, soft_wrap=True)


def print_analysis(out: Console, analysis) -> None:
    """The localization summary and the paths of the vendor-style files."""
    out.print("[bold]localization[/]", highlight=False)
    out.print(analysis.summary(), highlight=False, soft_wrap=True)
    out.print("vendor-style files:", highlight=False)
    for path in analysis.files:
        out.print(f"  {path}", highlight=False, soft_wrap=True)


def rerun_view(
    out: Console, store_root: str | Path, run_id: str, stage: str, sets, downstream, prefect,
    quiet: bool = False,
):  # fmt: skip
    """Rerun a stage, print the new run, and its localization beside its parent's
    (``quiet``: one line)."""
    from pipelines.rerun import localization_side_by_side, rerun

    if not quiet:
        out.print(f"[bold]rerun[/] of {run_id}: stage {stage}", highlight=False)
    with progress(out, quiet) as on_stage:
        result = rerun(
            store_root, run_id, stage, sets, downstream=downstream, use_prefect=prefect,
            on_stage=on_stage,
        )  # fmt: skip
    if quiet:
        out.print(f"{result.run_id} complete, {_divergence(result.analysis)}", highlight=False)
        return
    _finish_view(out, store_root, result)
    table = Table("finding", "pair / rank", f"parent {run_id}", f"rerun {result.run_id}")
    for r in localization_side_by_side(store_root, run_id, result.run_id):
        table.add_row(r["kind"], str(r["rank"]), r.get("parent", "-"), r.get("rerun", "-"))
    out.print(table)
