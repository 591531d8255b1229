"""The cost model against small cases computed by hand (nash-e: 32 x 32 MACs, 32 DDR
bytes per cycle, 1000 MHz, 4 MiB SRAM, int16 = 4 x int8)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from schemas.errors import SimulatorError
from simulator.program.cost import (
    COMPILER,
    Cost,
    buffer_dtypes,
    compute_cycles,
    instruction_cost,
    latency_table,
)
from simulator.program.isa import Instruction, Op, Program
from simulator.program.march import MARCHES

E = MARCHES["nash-e"]
CONV_CONSTS = {
    "w": np.zeros((16, 3, 3, 16), np.int8),  # packed [O_pad, kh, kw, C_pad]: K = 144
    "b": np.zeros(16, np.int32),  # 64 bytes
    "m": np.zeros(16, np.int16),  # 32 bytes
    "s": np.zeros(16, np.int8),  # 16 bytes -> constants 2304 + 112 = 2416 bytes
}
CONV = Instruction(Op.CONV, ("x",), ("y",), ("w", "b", "m", "s"), {}, ("conv",))


def test_small_conv_is_ddr_bound():
    shapes = {"x": (1, 4, 4, 16), "y": (1, 4, 4, 16)}
    # MACs = 256 outputs x 144 = 36864 -> 36 cycles; DDR = 256 + 256 + 2416 = 2928 -> 92
    assert compute_cycles(CONV, shapes, CONV_CONSTS, E) == 36
    assert instruction_cost(CONV, shapes, CONV_CONSTS, E) == Cost(92, 2928)


def test_large_conv_is_compute_bound_and_int16_costs_four_times():
    shapes = {"x": (1, 32, 32, 16), "y": (1, 32, 32, 16)}
    # MACs = 16384 x 144 = 2359296 -> 2304 cycles; DDR = 2 x 16384 + 2416 = 35184 -> 1100
    assert instruction_cost(CONV, shapes, CONV_CONSTS, E) == Cost(2304, 35184)
    d16 = {"x": "int16", "y": "int16"}
    # int16: 4 x 2304 compute; DDR = 2 x 32768 + 2416 = 67952
    assert instruction_cost(CONV, shapes, CONV_CONSTS, E, d16) == Cost(9216, 67952)


def test_bigger_mac_array_is_faster():
    shapes = {"x": (1, 32, 32, 16), "y": (1, 32, 32, 16)}
    # nash-p: 64 x 128 = 8192 MACs/cycle -> 288 cycles
    assert compute_cycles(CONV, shapes, CONV_CONSTS, MARCHES["nash-p"]) == 288


def test_linear_and_matmul_macs():
    lin = Instruction(Op.LINEAR, ("x",), ("y",), ("w",))
    # [O, K] = [10, 64]; out (2, 10): MACs = 20 x 64 = 1280 -> 2 cycles
    assert compute_cycles(lin, {"x": (2, 64), "y": (2, 10)}, {"w": np.zeros((10, 64))}, E) == 2
    mm = Instruction(Op.MATMUL, ("a", "b"), ("c",))
    shapes = {"a": (4, 8, 256), "b": (4, 256, 64), "c": (4, 8, 64)}
    # MACs = 2048 x 256 = 524288 -> 512 cycles
    assert compute_cycles(mm, shapes, {}, E) == 512


def test_elementwise_and_table_ops_by_elements_over_cols():
    add = Instruction(Op.ADD, ("a", "b"), ("c",))
    shapes = {"a": (1, 8, 8, 16), "b": (1, 8, 8, 16), "c": (1, 8, 8, 16)}
    # 1024 elements / 32 cols = 32 cycles; DDR 3 x 1024 bytes -> 96 cycles
    assert compute_cycles(add, shapes, {}, E) == 32
    assert instruction_cost(add, shapes, {}, E) == Cost(96, 3072)
    pool = Instruction(Op.REDUCE_MEAN, ("a",), ("m",))
    # the larger side counts: 1024 input elements -> 32 cycles
    assert compute_cycles(pool, {"a": (1, 8, 8, 16), "m": (1, 1, 1, 16)}, {}, E) == 32
    sm = Instruction(Op.SOFTMAX, ("a",), ("b",), ("t",))
    # 256 int16 elements x 4 passes x 4 / 32 = 128 cycles
    d = {"a": "int16", "b": "int16"}
    assert compute_cycles(sm, {"a": (4, 64), "b": (4, 64)}, {}, E, d) == 128


def test_missing_shape_or_constant_is_a_simulator_error():
    with pytest.raises(SimulatorError, match="no shape for buffer 'y'"):
        instruction_cost(CONV, {"x": (1, 4, 4, 16)}, CONV_CONSTS, E)
    with pytest.raises(SimulatorError, match="no constant 'w'"):
        instruction_cost(CONV, {"x": (1, 1), "y": (1, 1)}, {}, E)


def program() -> Program:
    """x -> fc1 (linear) -> h -> compiler layout -> h2 -> fused lut (act, relu) -> y."""
    instrs = [
        Instruction(Op.LINEAR, ("x",), ("h",), ("w",), {"out_dtype": "int8"}, ("fc1",)),
        Instruction(Op.LAYOUT, ("h",), ("h2",), (), {"op_type": "Reshape"}),
        Instruction(Op.LUT, ("h2",), ("y",), ("t",), {}, ("act", "relu")),
    ]
    consts = {"w": np.zeros((8, 16), np.int8), "t": np.zeros(256, np.int8)}
    return Program("nash-e", {"x": {"dtype": "int8"}}, {"y": {}}, instrs, consts)


SHAPES = {"x": (1, 16), "h": (1, 8), "h2": (1, 8), "y": (1, 8)}


def test_latency_table_with_everything_in_sram():
    rows = {r["layer_id"]: r for r in latency_table(program(), SHAPES, E)}
    assert list(rows) == ["fc1", COMPILER, "act", "relu"]
    # fc1: 128 MACs -> 1 cycle; DDR: first read of x 16 + w 128 (h stays on chip) -> 5
    assert (rows["fc1"]["cycles"], rows["fc1"]["ddr_bytes"]) == (5, 144)
    assert rows["fc1"]["est_us"] == pytest.approx(0.005)
    # layout: 8 elements -> 1 cycle, no DDR (h and h2 on chip)
    assert (rows[COMPILER]["cycles"], rows[COMPILER]["ddr_bytes"]) == (1, 0)
    # lut: y is a program output (8) + table 256 = 264 bytes -> 9 cycles, split over 2 ids
    assert (rows["act"]["cycles"], rows["act"]["ddr_bytes"]) == (4.5, 132)
    assert rows["relu"] == {**rows["act"], "layer_id": "relu"}


def test_latency_table_without_sram_counts_every_transfer():
    tiny = dataclasses.replace(E, sram_bytes=4)
    rows = {r["layer_id"]: r for r in latency_table(program(), SHAPES, tiny)}
    assert rows["fc1"]["ddr_bytes"] == 16 + 8 + 128
    assert rows[COMPILER]["ddr_bytes"] == 16
    assert rows["act"]["ddr_bytes"] == (8 + 8 + 256) / 2


def test_buffer_dtypes_follow_the_program():
    instrs = [
        Instruction(Op.QUANTIZE, ("x",), ("q",), (), {"dtype": "int16"}),
        Instruction(Op.CONV, ("q",), ("c",), ("w",), {"out_dtype": "int32"}),
        Instruction(Op.LAYOUT, ("c",), ("r",)),
        Instruction(Op.DEQUANTIZE, ("r",), ("out",), (), {"dtype": "int32"}),
    ]
    p = Program("nash-e", {"x": {"dtype": "float32"}}, {"out": {}}, instrs, {})
    assert buffer_dtypes(p) == {
        "x": "float32",
        "q": "int16",
        "c": "int32",
        "r": "int32",
        "out": "float32",
    }
