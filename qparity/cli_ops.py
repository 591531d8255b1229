"""``qparity ops``: the op table, generated from the entries themselves.

Registered on the main app as ``app.command("ops")(ops_command)``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from qparity.cli_options import LazyConsole, QuietOpt

out = LazyConsole()


def ops_command(
    op: Annotated[str | None, typer.Argument(help="Show one op only (e.g. hardsigmoid).")] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print docs/ops.md's Markdown instead.")
    ] = False,
    quiet: QuietOpt = False,
):
    """List every op the chain knows, one line each (one op: one line per field):
    category, aten targets, ONNX export, the instruction compile makes of it, and its
    kernels (numpy reference, executor's torch kernel, native).

    --quiet: the op names only, one per line.

    Example: qparity ops hardsigmoid
    """
    from schemas.errors import SpecError
    from stages.ops import BY_NAME
    from stages.ops.listing import COLUMNS, rows
    from stages.ops.listing import markdown as as_markdown

    if markdown:
        out.print(as_markdown(), end="", markup=False, highlight=False, soft_wrap=True)
        return
    found = [r for r in rows() if op is None or r["op"] == op]
    if not found:
        raise SpecError(
            f"no op {op!r} in the op table",
            where="qparity ops",
            hint=f"one of: {', '.join(BY_NAME)}",
        )
    if quiet:
        for r in found:
            out.print(r["op"], markup=False, highlight=False)
        return
    if op is not None:
        for c in COLUMNS:
            out.print(f"{c}: {found[0][c]}", markup=False, highlight=False, soft_wrap=True)
        return
    for r in found:
        out.print(
            f"{r['op']} ({r['family']}, {r['category']}): {r['aten targets']} -> ONNX "
            f"{r['ONNX']} -> {r['instruction']} [reference {r['reference']}; torch "
            f"{r['torch kernel']}; native {r['native']}]",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
