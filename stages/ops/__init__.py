"""The op table: every op the chain knows is one :class:`OpEntry`, one module per family.

An entry holds everything about its op (aten targets, quantizer placement, ONNX export
rule, convert rule, instruction; :class:`~stages.ops.entry.OpEntry`); the simulator side of
each instruction (reference evaluator, executor kernel, compiled kernels) is
:data:`simulator.instructions.INSTRUCTIONS`. The tables the stages use are views of
:data:`ENTRIES`: :func:`op_table` (prepare, quantizer), :func:`onnx_rules` (export),
:func:`convert_rules` (convert), :data:`PARAM_OPS`, :data:`ACCUMULATOR_USERS` and
:data:`TABLE_OPS`. ``qparity ops`` and docs/ops.md list the table (:mod:`stages.ops.listing`).

Adding an op: one entry in its family module (or a new module added to ``_FAMILIES``),
any kernel it needs, and its tests (stages/README.md, "Adding an op").
"""

from __future__ import annotations

from collections.abc import Callable

from stages.ops import (
    activations,
    composite,
    elementwise,
    layout,
    pooling,
    quantizers,
    resample,
    weighted,
)
from stages.ops.entry import Category, OpEntry

_FAMILIES = (weighted, elementwise, activations, composite, pooling, resample, layout, quantizers)
FAMILIES: dict[str, tuple[OpEntry, ...]] = {
    m.__name__.rsplit(".", 1)[1]: m.ENTRIES for m in _FAMILIES
}
"""Family module name -> its entries."""
ENTRIES: tuple[OpEntry, ...] = tuple(e for m in _FAMILIES for e in m.ENTRIES)
"""Every op, family by family."""
BY_NAME: dict[str, OpEntry] = {e.name: e for e in ENTRIES}


def op_table() -> dict[object, tuple[str, Category]]:
    """aten target -> (op name, category), for every entry with targets."""
    return {t: (e.name, e.category) for e in ENTRIES for t in e.targets}


def onnx_rules() -> dict[object, Callable]:
    """aten target -> export rule (entries without a rule are left out: export refuses)."""
    return {t: rule for e in ENTRIES for t, rule in e.onnx_rules().items()}


def convert_rules() -> dict[tuple[str, str], Callable]:
    """(domain, qat.onnx op type) -> convert rule; several entries may share one."""
    return {key: rule for e in ENTRIES for key, rule in e.convert_keys()}


PARAM_OPS: dict[str, int] = {
    e.name: e.activation_inputs for e in ENTRIES if e.activation_inputs is not None
}
"""Op -> how many leading tensor inputs are activations (the rest are parameters)."""
ACCUMULATOR_USERS: frozenset[str] = frozenset(e.name for e in ENTRIES if e.fuses_accumulator)
"""Ops a conv/linear hands its int32 accumulator to (fused, no quantizer in between)."""
TABLE_OPS: dict[str, str] = {e.name: e.table_op for e in ENTRIES if e.table_op}
"""Table op -> the custom ONNX op pre_export writes for it."""

__all__ = ["ENTRIES", "FAMILIES", "BY_NAME", "Category", "OpEntry", "op_table", "onnx_rules",
           "convert_rules", "PARAM_OPS", "ACCUMULATOR_USERS", "TABLE_OPS"]  # fmt: skip
