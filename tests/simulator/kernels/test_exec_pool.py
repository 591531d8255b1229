"""REDUCE_MEAN / REDUCE_SUM of simulator/kernels/exec_pool.py: the float64 path (sums and
``round_quotient`` under ``n max|x| max|mult| < 2**51``) and the int64 path, both equal to
the integer reference (int_ops QReduceMean / QReduceSum) on extreme data and exact ties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from simulator.kernels import exec_ops, exec_pool
from simulator.program.isa import Op
from tests.simulator.arith.test_kernels import rand_ints
from tests.simulator.runtime.test_executor import MODES, check, program


def _extremes(rng, shape, dt) -> np.ndarray:
    info = np.iinfo(dt)
    x = rand_ints(rng, shape, dt)
    x[0], x[1] = info.min, info.max
    return x


def _total_dtype(x, mult, attrs) -> torch.dtype:
    """Which path ``_reduce`` takes for these operands (float64 = the fast one)."""
    prog = program(Op.REDUCE_MEAN, [x], [mult, np.array([0])], attrs)
    consts, instr, xt = (
        exec_ops.ConstPool(prog.constants),
        prog.instructions[0],
        torch.from_numpy(x),
    )
    total, _ = exec_pool._reduce(instr, consts, xt, torch.from_numpy(mult),
                                 *exec_pool._reduce_axes(instr, xt))  # fmt: skip
    return total.dtype


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("dt", [np.int8, np.int16])
def test_reduce_float_path_equals_reference(seed, dt):
    rng = np.random.default_rng(seed)
    x = _extremes(rng, (3, 5, int(rng.integers(1, 40)), 4), dt)
    mode = MODES[seed % 2]
    for axes, keep in [([2], 0), ([2, 3], 1), ([1, 2, 3], 0)]:
        # small shifts with mult 1: sums land on exact ties of n << shift
        mult = np.array([1 if seed % 3 == 0 else int(rng.integers(1, 2**15))])
        shift = np.array([int(rng.choice([0, 1, 3, 11, 30]))])
        attrs = {"rounding": mode, "out_dtype": str(rng.choice(["int8", "int16", "int32"])),
                 "relu": seed % 2, "axes": axes, "keepdims": keep}  # fmt: skip
        assert _total_dtype(x, mult, attrs) == torch.float64
        check(Op.REDUCE_MEAN, "QReduceMean", [x], [mult, shift], attrs)
        check(Op.REDUCE_SUM, "QReduceSum", [x], [mult, shift], attrs)


@pytest.mark.parametrize("mode", MODES)
def test_reduce_above_the_bound_keeps_int64(mode):
    """31-bit multiplier on int16 sums: ``n max|x| max|mult|`` passes 2**51, int64 path."""
    x = _extremes(np.random.default_rng(1), (2, 3, 64), np.int16)
    mult, shift = np.array([2**31 - 1]), np.array([40])
    attrs = {"rounding": mode, "out_dtype": "int16", "relu": 0, "axes": [-1], "keepdims": 0}
    assert _total_dtype(x, mult, attrs) == torch.int64
    check(Op.REDUCE_MEAN, "QReduceMean", [x], [mult, shift], attrs)
