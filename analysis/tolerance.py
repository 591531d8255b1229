"""How many of its own steps a layer may be off, given a tolerance in int8 steps.

One rule for the localizer (analysis/localize.py: own errors and the triage's total
errors, a camera input's modelled rounding) and the report's heatmap colours
(analysis/report_html.py), kept free of heavy imports so the report does not load the chain.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.arith.board_input import fold_rounding_pixels, rounding_pixels

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


def camera_limit(spec, step: float) -> float | None:
    """Steps the board's first-layer input may be off behind a camera, for a spec
    (``stages.board_sim``, ``data``) and the input's ``step`` (None: the board is fed
    featuremaps, or no step).

    FORMULA: ``1 + max_c (pixels + bias_c) / (std_c * step)``: two roundings of values
    that lie ``d`` steps apart land at most ``d + 1`` steps apart, and ``d`` is the camera
    path's own rounding (``simulator.arith.board_input.rounding_pixels``) plus how far the
    folded mean/std conv's integer bias moves the mean (``fold_rounding_pixels``: up to
    1/128 pixel, two int16 steps), each pixel ``1 / (std_c * step)`` steps."""
    cfg, data = spec.stages.board_sim, spec.data
    if cfg.runtime_format == "featuremap" or not step:
        return None
    pixels = rounding_pixels(cfg.runtime_format, data.input_format, cfg.color)
    mean, std = np.asarray(data.mean or [0.0]), np.asarray(data.std or [1.0])
    bias = fold_rounding_pixels(mean, std, step)
    return 1.0 + float(np.max((pixels + bias) / (std * step)))
