"""The chain's stage names, in order: shared by the spec models and the SQL views without
importing pydantic (``qparity sql`` starts without the spec models: bench/cli.py)."""

from __future__ import annotations

STAGE_NAMES: tuple[str, ...] = (
    "prepare",
    "calibrate",
    "qat",
    "pre_export",
    "export",
    "convert",
    "compile",
    "board_sim",
)
"""Every stage of the chain, in chain order (the card's names)."""
