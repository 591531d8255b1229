"""Fault injection in a spec: known faults at a named stage and layer (or op type).

Faults are how localization is proven (docs/design.md "Localization"): a bench injects them at
random and checks the localizer names the stage and the layer. Each kind belongs to the
stage whose artifact it corrupts:

| kind | stage | what it does (``amount``) |
|---|---|---|
| calib_scale | calibrate | the layer's output scale x 2**(amount/4) (amount < 0: values clip) |
| lut_coarsen | pre_export | keep every 2**amount-th table entry (nearest below) |
| scale_steps | convert | output requantize multipliers x 2**(amount/4) |
| shift_off | convert | requantize shifts + amount (a power of two off) |
| bias_drop | convert | the int32 bias set to 0 |
| rounding_flip | convert | half_even <-> bpu_round in the layer's requantize |
| preprocess_swap | board_sim | camera RGB <-> BGR (amount 0) or BT.601 full <-> video range (1) |
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

FAULT_STAGES = {
    "calib_scale": "calibrate",
    "lut_coarsen": "pre_export",
    "scale_steps": "convert",
    "shift_off": "convert",
    "bias_drop": "convert",
    "rounding_flip": "convert",
    "preprocess_swap": "board_sim",
}
"""Fault kind -> the stage it is injected at."""

AMOUNTS = {
    "lut_coarsen": ("a whole number >= 0", lambda a: a >= 0 and a == int(a)),
    "shift_off": ("a whole number", lambda a: a == int(a)),
    "preprocess_swap": ("0 (RGB <-> BGR) or 1 (the other BT.601 range)", lambda a: a in (0, 1)),
}
"""Kinds whose ``amount`` is not any finite number: (what it must be, the check). A
fractional shift or coarsening applied nothing and was recorded as applied; a negative
coarsening crashed pre_export."""


class FaultSpec(BaseModel):
    """One injected fault."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal[
        "calib_scale",
        "lut_coarsen",
        "scale_steps",
        "shift_off",
        "bias_drop",
        "rounding_flip",
        "preprocess_swap",
    ]
    """What goes wrong (see the module docstring)."""
    stage: str | None = None
    """The stage it is injected at; defaults to the kind's stage, and must equal it."""
    layer: str | None = None
    """Canonical layer id hit by the fault (or ``op_type``: every layer of that type)."""
    op_type: str | None = None
    """Op type hit by the fault, e.g. conv (instead of ``layer``)."""
    amount: float = 1
    """Size of the fault, per kind."""

    @model_validator(mode="after")
    def _check(self) -> FaultSpec:
        want = FAULT_STAGES[self.kind]
        if (self.stage or want) != want:
            raise ValueError(f"a {self.kind} fault belongs to stage {want}, not {self.stage}")
        object.__setattr__(self, "stage", want)
        if self.kind != "preprocess_swap" and not (self.layer or self.op_type):
            raise ValueError(f"a {self.kind} fault needs a layer or an op_type")
        need, ok = AMOUNTS.get(self.kind, ("a finite number", math.isfinite))
        if not (math.isfinite(self.amount) and ok(self.amount)):
            raise ValueError(f"a {self.kind} fault's amount must be {need}, not {self.amount}")
        return self
