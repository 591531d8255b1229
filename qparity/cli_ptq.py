"""``qparity ptq SPEC``: the PTQ chain from an ONNX float model (the vendor's PTQ flow)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root

out = LazyConsole()


def ptq_command(
    spec: Annotated[
        Path, typer.Argument(help="PTQ spec (YAML), e.g. examples/digits_ptq/spec.yaml.")
    ],
    runs: RunsOpt = None,
    no_prefect: Annotated[
        bool, typer.Option("--no-prefect", help="Run the stages directly, without a Prefect flow.")
    ] = False,
    quiet: QuietOpt = False,
):
    """Run the PTQ chain (original, optimized, calibrated, ptq, quantized, hbm, board) on an
    ONNX float model; prints each stage's status, time and top-1.

    Each stage is a Prefect task of the flow "qparity-ptq-chain" (unless --no-prefect).
    The spec's `pipeline:` may name pipelines/named/ptq/ptq_chain or ptq_to_quantized.
    --quiet: no stage table, only the final line.

    Example: qparity ptq examples/digits_ptq/spec.yaml
    """
    from pipelines.ptq import load_ptq_spec, model_path, run_ptq
    from schemas.store import RunStore

    root = store_root(runs)
    cfg, text = load_ptq_spec(spec)
    path = model_path(cfg)
    before = {m.run_id for m in RunStore(root).list_runs()}
    try:
        run_id = run_ptq(path, cfg, root, text, use_prefect=not no_prefect)
    finally:  # a failed run is shown too, then its error printed by the CLI
        new = [m.run_id for m in RunStore(root).list_runs() if m.run_id not in before]
        if new and not quiet:
            _show(RunStore(root).open(new[-1]), cfg)
    where = RunStore(root).open(run_id).root / "artifacts"
    out.print(f"run {run_id} complete; artifacts in {where}", highlight=False)


def _show(run, cfg) -> None:
    """One row per stage: status, duration, the primary metric (``compare.primary``, else
    top1 with labels, else the cosine against the original model), and the optimized min
    layer cosine."""
    from analysis.primary import run_primary
    from schemas.tables import read_run_table
    from stages.ptq.chain import STAGES

    m = run.manifest()
    metrics = {(r["stage"], r["metric"]): r["value"] for r in read_run_table(run, "metrics")}
    primary = run_primary(run, cfg.judging())
    from rich.table import Table

    table = Table(
        "stage", "status", "duration_s", primary.name, "note", title=f"PTQ run {m.run_id}"
    )
    for stage in STAGES:
        rec = m.stages.get(stage.name)
        if rec is None:
            continue
        top1 = primary.values.get(stage.name)
        note = {
            "optimized": f"min layer cosine {metrics.get(('optimized', 'min_layer_cosine'), 0):.6f}",
            "hbm": f"{metrics.get(('hbm', 'bit_exact_layers'), 0):.0f} layers bit-exact vs quantized",
        }.get(stage.name, "")
        table.add_row(
            stage.name,
            rec.status,
            f"{rec.duration_s:.2f}" if rec.duration_s is not None else "-",
            f"{top1:.4f}" if top1 is not None else "-",
            note if rec.status == "complete" else (rec.error or "")[:80],
        )
    out.print(table)
