"""A readable view of a :class:`~simulator.program.isa.Program` (what ``debug/hbm.txt`` holds).

:func:`render` is a numbered instruction listing (index | op | inputs -> outputs | consts
| layer ids | key attrs); :func:`debug_map` maps each instruction to the canonical layer
ids it covers. Saving and loading ``.hbm`` files is :mod:`simulator.program.hbm`.
"""

from __future__ import annotations

from simulator.program.isa import Op, Program


def debug_map(program: Program) -> dict[int, tuple[str, ...]]:
    """Instruction index -> the canonical layer ids it covers (empty: compiler-inserted)."""
    return {i: tuple(ins.layer_ids) for i, ins in enumerate(program.instructions)}


def _key_attrs(attrs: dict, limit: int = 6, width: int = 32) -> str:
    """The short attributes (repr at most ``width`` chars), at most ``limit`` of them."""
    items = [f"{k}={v!r}" for k, v in attrs.items() if len(repr(v)) <= width]
    more = len(attrs) - min(len(items), limit)
    return " ".join(items[:limit]) + (f" (+{more} more)" if more else "")


def render(program: Program) -> str:
    """A numbered listing: index | op | inputs -> outputs | consts | layer ids | key attrs."""
    lines = [
        f"# {program.march}: {len(program.instructions)} instructions, "
        f"{len(program.constants)} constants, inputs {', '.join(program.inputs)} -> "
        f"outputs {', '.join(program.outputs)}"
    ]
    width = len(str(max(len(program.instructions) - 1, 0)))
    for i, ins in enumerate(program.instructions):
        cols = [
            f"{i:>{width}}",
            Op(ins.op).value,
            f"{', '.join(ins.inputs)} -> {', '.join(ins.outputs)}",
            ", ".join(ins.consts) or "-",
            ", ".join(ins.layer_ids) or "(compiler)",
            _key_attrs(ins.attrs) or "-",
        ]
        lines.append(" | ".join(cols))
    return "\n".join(lines) + "\n"
