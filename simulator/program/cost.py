"""A cost model of a Program on a march: cycles and DDR traffic per instruction and layer.

This is a *model*, not a measurement: no board was timed. It exists to rank layers and
compare marches and settings (e.g. consistency level 0's unfused requantize), and every
number in it follows from the march's modelled sizes (simulator.program.march) and the rules below.

Compute (``compute_cycles``):
- conv / linear / matmul: ``MACs * f / (rows * cols)`` cycles. ``MACs = out_elements * K``
  where ``K`` is the weight's elements per output channel: the weight is stored as compile
  packs it, ``[O, ..., C]`` (conv: ``[O_pad, kh, kw, C_pad]``; linear: ``[O, K]``), so
  ``K = weight.size / weight.shape[0]``; padded channels cost like real ones, as on the
  board. matmul (two activations) takes ``K`` from its first input's last axis.
- every other op: ``elements * passes * f / cols`` cycles, ``elements`` the larger of the
  first input's and the outputs' element counts; softmax and layernorm make ``PASSES``
  passes over their data (max/sum/exp/normalize), everything else one.
- ``f`` is the march's relative cost of the costliest activation dtype the instruction
  touches (int8 = 1, int16 = 4; dtypes not in the table count 1).

Memory: an instruction reads its inputs and constants and writes its outputs over DDR.
Standalone, every byte counts. Over a program (``latency_table``) a buffer that fits in
SRAM by itself (``bytes <= sram_bytes``; no capacity accounting across buffers) stays on
chip once made or first read: only its first read (program inputs) counts, never its
writes or later reads; program outputs are always written; constants are always read (no
reuse across instructions). ``cycles = max(compute, ddr_bytes / ddr_bytes_per_cycle)``,
i.e. compute and DDR transfers overlap perfectly (a roofline), ``us = cycles / clock_mhz``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from schemas.errors import SimulatorError
from simulator.program.isa import Instruction, Op, Program
from simulator.program.march import March

MAC_OPS = frozenset({Op.CONV, Op.LINEAR, Op.MATMUL})
PASSES = {Op.SOFTMAX: 4, Op.LAYERNORM: 4}
"""Modelled passes over the data of the multi-step table ops."""
COMPILER = "(compiler)"
"""The latency-table row of instructions with no layer id (inserted layout changes)."""
_FLOAT_OUT = frozenset({Op.DEQUANTIZE})


@dataclass(frozen=True)
class Cost:
    """Modelled cycles and DDR bytes of one instruction."""

    cycles: int
    ddr_bytes: int


def _shape(shapes: Mapping, buf: str, ins: Instruction) -> tuple[int, ...]:
    if buf not in shapes:
        raise SimulatorError(
            f"no shape for buffer {buf!r} of {Op(ins.op).value} {ins.layer_ids or ''}",
            hint="pass the shapes the executor recorded for every buffer",
        )
    return tuple(shapes[buf])


def _const(consts: Mapping, name: str, ins: Instruction) -> np.ndarray:
    if name not in consts:
        raise SimulatorError(
            f"no constant {name!r} for {Op(ins.op).value} {ins.layer_ids or ''}",
            hint="pass the program's constants",
        )
    return np.asarray(consts[name])


def _macs(ins: Instruction, shapes: Mapping, consts: Mapping) -> int:
    """Multiply-accumulates of a conv/linear/matmul (see the module docstring)."""
    out = math.prod(_shape(shapes, ins.outputs[0], ins))
    if ins.op is Op.MATMUL:
        return out * _shape(shapes, ins.inputs[0], ins)[-1]
    w = _const(consts, ins.consts[0] if ins.consts else "(weight)", ins)
    return out * (w.size // max(w.shape[0] if w.ndim else 1, 1))


def _factor(ins: Instruction, dtypes: Mapping, march: March) -> int:
    table = march.ops_per_cycle_by_dtype
    bufs = (*ins.inputs[:1], *ins.outputs)
    return max((table.get(dtypes.get(b, "int8"), 1) for b in bufs), default=1)


def compute_cycles(
    ins: Instruction, shapes: Mapping, consts: Mapping, march: March, dtypes: Mapping | None = None
) -> int:
    """Modelled compute cycles of one instruction (no memory)."""
    f = _factor(ins, dtypes or {}, march)
    rows, cols = march.mac_array
    if ins.op in MAC_OPS:
        return math.ceil(_macs(ins, shapes, consts) * f / (rows * cols))
    outs = sum(math.prod(_shape(shapes, b, ins)) for b in ins.outputs)
    first = math.prod(_shape(shapes, ins.inputs[0], ins)) if ins.inputs else 0
    return math.ceil(max(first, outs) * PASSES.get(ins.op, 1) * f / cols)


def _nbytes(shapes: Mapping, buf: str, ins: Instruction, dtypes: Mapping) -> int:
    return math.prod(_shape(shapes, buf, ins)) * np.dtype(dtypes.get(buf, "int8")).itemsize


def instruction_cost(
    ins: Instruction,
    shapes: Mapping[str, tuple],
    consts: Mapping,
    march: March,
    dtypes: Mapping[str, str] | None = None,
    on_chip: frozenset[str] = frozenset(),
) -> Cost:
    """Modelled cycles and DDR bytes of ``ins``. ``dtypes``: buffer -> dtype (default
    int8); buffers in ``on_chip`` are in SRAM and cost no DDR traffic."""
    dtypes = dtypes or {}
    ddr = sum(
        _nbytes(shapes, b, ins, dtypes) for b in (*ins.inputs, *ins.outputs) if b not in on_chip
    )
    ddr += sum(_const(consts, c, ins).nbytes for c in ins.consts)
    cycles = max(
        compute_cycles(ins, shapes, consts, march, dtypes),
        math.ceil(ddr / march.ddr_bytes_per_cycle),
    )
    return Cost(cycles, ddr)


def buffer_dtypes(program: Program) -> dict[str, str]:
    """Each buffer's dtype as the program declares it: program inputs' ``dtype``, an
    instruction's ``out_dtype`` (or ``dtype`` for quantize) attribute, float32 after
    dequantize, else its first input's."""
    out = {n: str(d.get("dtype", "float32")) for n, d in program.inputs.items()}
    for ins in program.instructions:
        a = ins.attrs
        d = (
            "float32"
            if ins.op in _FLOAT_OUT
            else a.get("out_dtype") or (a.get("dtype") if ins.op is Op.QUANTIZE else None)
        )
        d = d or (out.get(ins.inputs[0], "int8") if ins.inputs else "int8")
        out.update(dict.fromkeys(ins.outputs, str(d)))
    return out


def program_costs(
    program: Program,
    shapes: Mapping[str, tuple],
    march: March,
    dtypes: Mapping[str, str] | None = None,
) -> list[Cost]:
    """Each instruction's cost with the SRAM residency rule of the module docstring."""
    dtypes = {**buffer_dtypes(program), **(dtypes or {})}
    seen: set[str] = set()
    costs = []
    for ins in program.instructions:
        bufs = (*ins.inputs, *ins.outputs)
        fits = {
            b
            for b in bufs
            if b not in program.outputs and _nbytes(shapes, b, ins, dtypes) <= march.sram_bytes
        }
        on_chip = frozenset(seen | (fits & set(ins.outputs)))
        costs.append(instruction_cost(ins, shapes, program.constants, march, dtypes, on_chip))
        seen |= fits
    return costs


def latency_table(
    program: Program,
    shapes: Mapping[str, tuple],
    march: March,
    dtypes: Mapping[str, str] | None = None,
) -> list[dict]:
    """One row per layer id (first-appearance order): layer_id, cycles, ddr_bytes, est_us.

    A fused instruction's cost is split evenly over the ids it covers; instructions with no
    id are summed under :data:`COMPILER`."""
    rows: dict[str, dict] = {}
    for ins, c in zip(
        program.instructions, program_costs(program, shapes, march, dtypes), strict=True
    ):
        ids = ins.layer_ids or (COMPILER,)
        for lid in ids:
            r = rows.setdefault(lid, {"layer_id": lid, "cycles": 0.0, "ddr_bytes": 0.0})
            r["cycles"] += c.cycles / len(ids)
            r["ddr_bytes"] += c.ddr_bytes / len(ids)
    for r in rows.values():
        r["est_us"] = r["cycles"] / march.clock_mhz
    return list(rows.values())
