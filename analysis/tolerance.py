"""How many of its own steps a layer may be off, given a tolerance in int8 steps.

One rule for the localizer (analysis/localize.py: own errors and the triage's total
errors) and the report's heatmap colours (analysis/report_html.py), kept free of heavy
imports so the report does not load the chain.
"""

from __future__ import annotations

import math

EPS = 1e-2
"""Float slack on own errors in steps (float32 values of int16 layers are not exact)."""
WIDE = {"int16": 256.0}
"""A tolerance in int8 steps is this many steps of a wider layer (same range, finer grid)."""
ACCUMULATORS = {"int32"}
"""Wide dtypes whose grid is the product of the input scales, not a share of their range:
one int8 step of such a layer is 1/127 of its largest value (see :func:`limit`)."""


def factor(dtype: str | None, span: float | None = None) -> float:
    """Steps of a ``dtype`` layer per int8 step: ``WIDE[dtype]`` for a wider layer.

    ``span`` (the layer's largest |value| in its own steps) gives an int32 accumulator its
    factor, ``max(span / 127, 1)``: one int8 step of its range. Without a span (own
    errors, which stay below a step in clean runs) an accumulator gets none."""
    if dtype in ACCUMULATORS and span is not None and math.isfinite(span):
        return max(span / 127.0, 1.0)
    return WIDE.get(dtype, 1.0)


def limit(tolerance: float, dtype: str | None, span: float | None = None) -> float:
    """Steps a layer of ``dtype`` may be off: the tolerance in int8 steps times
    :func:`factor`, plus the float slack ``EPS``."""
    return tolerance * factor(dtype, span) + EPS


def span_of(stats: dict, step: float) -> float | None:
    """A layer's largest |value| in steps of ``step``, from its aggregate layer_stats
    (``base_min``, ``base_max``); None without a step."""
    top = max(abs(stats.get("base_min") or 0.0), abs(stats.get("base_max") or 0.0))
    return top / step if step else None


def total_limit(tolerance: float, dtype: str | None, stats: dict, step: float) -> float:
    """:func:`limit` for a layer's total error (aggregate layer_stats ``stats``, step
    ``step``): inherited error grows an accumulator's total error with its fan-in, so it
    is judged against its range."""
    return limit(tolerance, dtype, span_of(stats, step))
