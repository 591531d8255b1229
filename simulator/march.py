"""The modelled BPU marches as data: what each one supports.

Public material (VENDOR-FACTS.md): Nash marches take int8 and int16 activations and int8
per-output-channel conv/linear weights; a conv/linear may output int32. Nothing public says
any Nash march has int16 weights, so none does here; a spec asking for them is refused.
Issue #5 extends each row (channel alignment, SRAM, MAC array) for the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import SpecError


@dataclass(frozen=True)
class March:
    """One march's capabilities."""

    name: str
    activation_dtypes: tuple[str, ...] = ("int8", "int16")
    weight_dtypes: tuple[str, ...] = ("int8",)
    high_precision_output: bool = True  # conv/linear may output int32
    consistency_strategy: bool = False  # levels 0-2 exist (J6E/M only)


MARCHES = {
    m.name: m
    for m in (
        March("nash-e", consistency_strategy=True),
        March("nash-m", consistency_strategy=True),
        March("nash-p"),
        March("nash-h"),
        March("nash-b"),
    )
}


def check_dtypes(march: str, weight_dtype: str, activation_dtypes: set[str]) -> March:
    """The march row; a SpecError if the spec asks for a dtype it does not have."""
    m = MARCHES[march]
    if weight_dtype not in m.weight_dtypes:
        raise SpecError(
            f"march {march} has no {weight_dtype} weights (it has {', '.join(m.weight_dtypes)})",
            where="quant.weight_dtype",
            hint="use int8 weights; put int16 on activations via quant.overrides",
        )
    bad = activation_dtypes - set(m.activation_dtypes)
    if bad:
        raise SpecError(
            f"march {march} has no {', '.join(sorted(bad))} activations",
            where="quant",
            hint=f"use {', '.join(m.activation_dtypes)}",
        )
    return m
