"""The op table as rows and as Markdown: what ``qparity ops`` prints and docs/ops.md holds.

Generated from the entries (:data:`stages.ops.ENTRIES`) and the instruction table
(:data:`simulator.instructions.INSTRUCTIONS`) alone, so the list cannot drift from the code.
``python -m stages.ops.listing`` rewrites docs/ops.md; a test fails when it is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from schemas.fileio import atomic_write_text
from simulator.instructions import INSTRUCTIONS
from stages.ops import FAMILIES, OpEntry

DOC = Path(__file__).resolve().parents[2] / "docs/ops.md"
COLUMNS = ("op", "family", "category", "aten targets", "ONNX", "instruction", "reference",
           "torch kernel", "native")  # fmt: skip


def target_name(target) -> str:
    """``aten.add.Tensor`` -> ``add.Tensor``; ``operator.getitem`` -> ``getitem``."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def inplace_names(target) -> list[str]:
    """The in-place overload ``aten.op_.overload`` that functionalize rewrites to ``target``."""
    if not isinstance(target, torch._ops.OpOverload):
        return []
    packet = getattr(torch.ops.aten, f"{target._opname}_", None)
    found = getattr(packet, target._overloadname, None) if packet is not None else None
    return [target_name(found)] if found is not None else []


def _fn(f) -> str:
    return f if isinstance(f, str) else f"{f.__module__.rsplit('.', 1)[-1]}.{f.__name__}"


def row(family: str, e: OpEntry) -> dict[str, str]:
    """One entry as strings, keyed by :data:`COLUMNS`."""
    instrs = [INSTRUCTIONS[op] for op in e.instructions]
    targets = [n for t in e.targets for n in [target_name(t), *inplace_names(t)]]
    return {
        "op": e.name,
        "family": family,
        "category": str(e.category or "quantizer"),
        "aten targets": ", ".join(targets) or "-",
        "ONNX": ", ".join(e.onnx_ops) if e.onnx is not None or not e.targets else "(none)",
        "instruction": ", ".join(str(i.op) for i in instrs),
        "reference": ", ".join(_fn(i.reference) for i in instrs),
        "torch kernel": ", ".join(_fn(i.kernel) for i in instrs),
        "native": ", ".join(sorted({n for i in instrs for n in i.native})) or "-",
    }


def rows() -> list[dict[str, str]]:
    """Every entry, family by family."""
    return [row(family, e) for family, entries in FAMILIES.items() for e in entries]


def markdown() -> str:
    """docs/ops.md: the table, one row per op."""
    head = [
        "# Op table",
        "",
        "Generated from `stages/ops/` and `simulator/instructions.py` by",
        "`python -m stages.ops.listing` (also `qparity ops`); do not edit by hand.",
        "In-place forms (`relu_`) are rewritten to the functional target before anything",
        "classifies. Instruction `cpu`: a float island on the board's CPU side.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    body = ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in rows()]
    return "\n".join(head + body) + "\n"


if __name__ == "__main__":
    atomic_write_text(DOC, markdown())
    sys.stdout.write(f"wrote {DOC}\n")
