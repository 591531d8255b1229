"""The modelled BPU marches as data: what each one supports and how big it is.

Public vendor material: Nash marches take int8 and int16 activations and int8
per-output-channel conv/linear weights; a conv/linear may output int32; requantize uses an
integer multiplier (16 bits in the public example) and a shift; the hardware rounds with
``bpu_round``; an int16 LUT is 6 tables of 64 entries and the board allows up to 64 segments
of 64 entries. Nothing public says any Nash march has int16 weights, so none does here; a
spec asking for them is refused.

Everything else in a row -- channel alignment, SRAM size, MAC array, clock, DDR bandwidth,
the int16/int8 cost ratio -- is a *modelled choice*, not a vendor fact: plausible numbers
that order the marches sensibly (nash-b < nash-e < nash-m < nash-p < nash-h) and feed the
compiler's padding and the cost model (simulator.program.cost). Change them here, nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.errors import SpecError

MIB = 1 << 20
LUT_MAX_SEGMENTS = 64
"""The board's maximum number of int16 LUT segments (vendor fact)."""
LUT_MAX_ENTRIES = 64
"""The board's maximum number of entries per int16 LUT segment (vendor fact)."""


def _relative_cost() -> dict[str, int]:
    return {"int8": 1, "int16": 4}


@dataclass(frozen=True)
class March:
    """One march's capabilities and (modelled) sizes. Data only, no behaviour.

    ``channel_alignment``: channels of NHWC activations and packed weights are padded to a
    multiple of this (modelled: 16 on nash-e/m, 32 on nash-p/h). ``multiplier_bits``: the
    requantize multiplier width. ``rounding``: the hardware tie rule (``bpu_round``).
    ``lut_segments`` x ``lut_entries``: the default int16 LUT (6 x 64). ``sram_bytes``: the
    on-chip buffer; ``mac_array``: (rows, cols) int8 MACs per cycle; ``clock_mhz``;
    ``ddr_bytes_per_cycle``: DDR bandwidth at the BPU clock. ``ops_per_cycle_by_dtype``:
    the relative cost of one op per activation dtype (int8 = 1; int16 = 4 means an int16
    MAC or vector op takes four int8 slots).
    """

    name: str
    activation_dtypes: tuple[str, ...] = ("int8", "int16")
    weight_dtypes: tuple[str, ...] = ("int8",)
    high_precision_output: bool = True  # conv/linear may output int32
    consistency_strategy: bool = False  # levels 0-2 exist (J6E/M only)
    channel_alignment: int = 16
    multiplier_bits: int = 16
    rounding: str = "bpu_round"
    lut_segments: int = 6
    lut_entries: int = 64
    sram_bytes: int = 4 * MIB
    mac_array: tuple[int, int] = (32, 32)
    clock_mhz: int = 1000
    ddr_bytes_per_cycle: int = 32
    ops_per_cycle_by_dtype: dict[str, int] = field(
        default_factory=_relative_cost, hash=False, compare=True
    )


MARCHES = {
    m.name: m
    for m in (
        March("nash-e", consistency_strategy=True),
        March(
            "nash-m",
            consistency_strategy=True,
            sram_bytes=8 * MIB,
            mac_array=(64, 64),
            clock_mhz=1200,
            ddr_bytes_per_cycle=64,
        ),
        March(
            "nash-p",
            channel_alignment=32,
            sram_bytes=16 * MIB,
            mac_array=(64, 128),
            clock_mhz=1500,
            ddr_bytes_per_cycle=64,
        ),
        March(
            "nash-h",
            channel_alignment=32,
            sram_bytes=32 * MIB,
            mac_array=(128, 128),
            clock_mhz=1500,
            ddr_bytes_per_cycle=128,
        ),
        March("nash-b", sram_bytes=2 * MIB, clock_mhz=800, ddr_bytes_per_cycle=16),
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
