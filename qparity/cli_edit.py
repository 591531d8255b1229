"""``qparity edit``: the vendor's bc_editor: fall numbered ops of qat.onnx back to float."""

from __future__ import annotations

from typing import Annotated

import typer

from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root

out = LazyConsole()


def edit_command(
    run_id: Annotated[str, typer.Argument(help="A run with export done (see `qparity runs`).")],
    remove_fake_quant: Annotated[
        str,
        typer.Option("--remove-fake-quant", help="Node numbers of debug/qat_onnx.txt: 1-100,102"),
    ],
    runs: RunsOpt = None,
    quiet: QuietOpt = False,
):
    """Remove fake quant from numbered ops, reconvert, rank the fallbacks by consistency gain
    (--quiet: one line per fallback: nodes, L1, cosine, L1 gain).

    The edit of all the numbers is written to the run's artifacts/edit/<numbers>/qat_modified.onnx;
    the run's injected faults stay in every model compared.

    Example: qparity edit my-run --remove-fake-quant 14-25,40
    """
    from analysis.edit_run import SAMPLES, edit_run

    root = store_root(runs)
    result = edit_run(root, run_id, remove_fake_quant)
    base, faults = result.base, f", the run's {result.faults} convert fault(s) re-applied"
    if quiet:
        for f in result.fallbacks:
            out.print(f"{f.numbers} {f.l1:.6g} {f.cosine:.6f} {f.gain:.6g}", highlight=False)
        return
    out.print(
        f"unedited: quantized vs qat.onnx output L1 {base['l1']:.6g}, cosine "
        f"{base['cosine']:.6f} ({SAMPLES} samples at most{faults if result.faults else ''})",
        highlight=False,
    )
    _print_fallbacks(result.fallbacks)
    for why in result.kept:
        out.print(f"kept: {why}", highlight=False)
    written = f"{str(root).rstrip('/')}/{run_id}/{result.written}"
    out.print(f"edited qat.onnx written: {written}", highlight=False, soft_wrap=True)


def _print_fallbacks(fallbacks) -> None:
    from rich.table import Table

    table = Table("nodes in float", "Q/DQ pairs removed", "L1", "cosine", "L1 gain",
                  title="fallbacks, most consistency gained first")  # fmt: skip
    skipped = any(f.faults_skipped for f in fallbacks)
    if skipped:
        table.add_column("run faults with nothing left to hit")
    for f in fallbacks:
        cells = [f.numbers, str(f.removed), f"{f.l1:.6g}", f"{f.cosine:.6f}", f"{f.gain:.6g}"]
        table.add_row(*cells, *([", ".join(f.faults_skipped) or "-"] if skipped else []))
    out.print(table)
