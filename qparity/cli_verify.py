"""``qparity verify``: the vendor's hb_verifier for any two models of a run, or files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root

out = LazyConsole()


def verify_command(
    model_a: Annotated[str, typer.Argument(help="RUN_ID:stage, a .onnx file or a .hbm file.")],
    model_b: Annotated[str, typer.Argument(help="The other model, same forms.")],
    input_npy: Annotated[Path, typer.Option("-i", "--input", help="Input batch (.npy).")],
    digits: Annotated[int, typer.Option(help="Outputs agree when |a-b| <= 10**-digits.")] = 5,
    runs: RunsOpt = None,
    quiet: QuietOpt = False,
):
    """Per-node cosine similarity and output consistency of two models, with advice
    (--quiet: the advice line only).

    Example: qparity verify my-run:export my-run:convert -i input.npy
    """
    from rich.table import Table

    from analysis.verify import load_input, verify
    from analysis.verify_sides import side

    root = store_root(runs)
    a, b = side(model_a, root), side(model_b, root)
    result = verify(a, b, load_input(input_npy), digits)
    if quiet:
        out.print(f"advice: {result.advice}", highlight=False, soft_wrap=True)
        return
    if result.nodes:
        table = Table("NodeName", "TensorName", "cosine", title=f"{a.name} vs {b.name}")
        for n in result.nodes:
            style = "red" if n["cosine"] < 0.99 else None
            table.add_row(n["NodeName"], n["TensorName"], f"{n['cosine']:.6f}", style=style)
        out.print(table)
    table = Table(*result.outputs[0], title="outputs")
    for o in result.outputs:
        table.add_row(*(f"{v:.6g}" if isinstance(v, float) else str(v) for v in o.values()))
    out.print(table)
    out.print(f"advice: {result.advice}", highlight=False, soft_wrap=True)
