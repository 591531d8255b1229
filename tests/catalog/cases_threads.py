"""A bad thread setting for the simulator, for the catalog (tests/catalog/test_bad_inputs.py):
``QPARITY_THREADS`` that is not a count is named before a run starts."""

from __future__ import annotations

import os

from schemas.errors import SimulatorError

HBM = "artifacts/compile/model.hbm"


def _run_with_threads(env, value: str):
    from simulator.program import hbm
    from simulator.runtime.executor import Executor

    ex = Executor(hbm.load(env.copy_of(HBM)))
    before = os.environ.get("QPARITY_THREADS")
    os.environ["QPARITY_THREADS"] = value
    try:
        return ex.run({})
    finally:
        if before is None:
            os.environ.pop("QPARITY_THREADS", None)
        else:
            os.environ["QPARITY_THREADS"] = before


def cases() -> dict:
    return {
        "QPARITY_THREADS not a number": (lambda e: _run_with_threads(e, "two"), SimulatorError,
                                         "QPARITY_THREADS"),
        "QPARITY_THREADS zero": (lambda e: _run_with_threads(e, "0"), SimulatorError,
                                 "QPARITY_THREADS"),
    }  # fmt: skip
