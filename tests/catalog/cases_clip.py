"""A tampered fused clip for the catalog (tests/catalog/test_bad_inputs.py): a CONV whose
``clip`` bounds do not keep 0 (compile fuses only ``lo <= 0 <= hi``: a ReLU6) is refused
naming the attribute and the instruction, not clamped into wrong padding channels."""

from __future__ import annotations

import dataclasses

import numpy as np

from schemas.errors import SimulatorError

HBM = "artifacts/compile/model.hbm"


def _run_with_clip(env, bounds: list[int]):
    from simulator.program import hbm
    from simulator.program.isa import Op
    from simulator.runtime.executor import Executor

    program = hbm.load(env.copy_of(HBM))
    at = next(i for i, ins in enumerate(program.instructions) if ins.op is Op.CONV)
    ins = program.instructions[at]
    program.instructions[at] = dataclasses.replace(ins, attrs={**ins.attrs, "clip": bounds})
    name, spec = next(iter(program.inputs.items()))
    x = np.zeros([1 if d < 0 else d for d in spec["shape"]], np.float32)
    return Executor(program).run({name: x})


def cases() -> dict:
    return {
        "fused clip above 0": (lambda e: _run_with_clip(e, [3, 40]), SimulatorError,
                               "attrs.clip"),
        "fused clip below 0": (lambda e: _run_with_clip(e, [-40, -3]), SimulatorError,
                               "attrs.clip"),
    }  # fmt: skip
