"""The march table's invariants: every row is complete, consistent and ordered."""

from __future__ import annotations

import math

import pytest

from schemas.errors import SpecError
from simulator.arith import fixedpoint as fp
from simulator.program.march import LUT_MAX_ENTRIES, LUT_MAX_SEGMENTS, MARCHES, check_dtypes

ROWS = list(MARCHES.values())


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def test_table_names_the_five_nash_marches():
    assert set(MARCHES) == {"nash-e", "nash-m", "nash-p", "nash-h", "nash-b"}
    assert all(name == m.name for name, m in MARCHES.items())


@pytest.mark.parametrize("m", ROWS, ids=lambda m: m.name)
def test_row_invariants(m):
    assert _pow2(m.channel_alignment) and m.channel_alignment >= 8
    assert m.multiplier_bits == 16
    assert m.rounding == "bpu_round" and m.rounding in fp.ROUNDING_MODES
    assert (m.lut_segments, m.lut_entries) == (6, 64)
    assert m.lut_segments <= LUT_MAX_SEGMENTS and m.lut_entries <= LUT_MAX_ENTRIES
    assert _pow2(m.sram_bytes) and m.sram_bytes >= 1 << 20
    assert len(m.mac_array) == 2 and all(_pow2(d) for d in m.mac_array)
    assert m.clock_mhz > 0 and m.ddr_bytes_per_cycle > 0
    assert m.ops_per_cycle_by_dtype["int8"] == 1
    assert m.ops_per_cycle_by_dtype["int16"] >= m.ops_per_cycle_by_dtype["int8"]
    assert set(m.ops_per_cycle_by_dtype) <= set(m.activation_dtypes)
    assert m.weight_dtypes == ("int8",) and m.high_precision_output
    hash(m)  # frozen rows stay hashable despite the dict field


def test_modelled_sizes_match_the_design_choices():
    e, m, p = MARCHES["nash-e"], MARCHES["nash-m"], MARCHES["nash-p"]
    assert (e.channel_alignment, m.channel_alignment, p.channel_alignment) == (16, 16, 32)
    assert (e.sram_bytes, m.sram_bytes, p.sram_bytes) == (4 << 20, 8 << 20, 16 << 20)
    assert (e.mac_array, m.mac_array, p.mac_array) == ((32, 32), (64, 64), (64, 128))


def test_bigger_marches_are_not_smaller_anywhere():
    order = [MARCHES[n] for n in ("nash-b", "nash-e", "nash-m", "nash-p", "nash-h")]
    for small, big in zip(order, order[1:], strict=False):
        assert small.sram_bytes <= big.sram_bytes
        assert math.prod(small.mac_array) <= math.prod(big.mac_array)
        assert small.ddr_bytes_per_cycle <= big.ddr_bytes_per_cycle


def test_consistency_strategy_only_on_j6e_m():
    assert {m.name for m in ROWS if m.consistency_strategy} == {"nash-e", "nash-m"}


def test_rows_do_not_share_their_cost_table():
    assert MARCHES["nash-e"].ops_per_cycle_by_dtype is not MARCHES["nash-m"].ops_per_cycle_by_dtype


def test_check_dtypes_still_refuses_int16_weights_and_unknown_activations():
    assert check_dtypes("nash-m", "int8", {"int8", "int16"}) is MARCHES["nash-m"]
    with pytest.raises(SpecError, match="no int16 weights"):
        check_dtypes("nash-e", "int16", {"int8"})
    with pytest.raises(SpecError, match="no fp8 activations"):
        check_dtypes("nash-p", "int8", {"fp8"})
