"""How a layer's own quantization error splits into its weights' and its output's share.

On the float -> calibrate pair, a layer's own error is ``analysis - reverted``: ``reverted``
is the float layer computed on the quantized inputs. Passing ``reverted`` through the
layer's own output quantizer gives ``q(reverted)`` (rounded to the step, clamped to the
dtype's grid); what the output quantizer adds is the activation share, what is left the
weight share (:func:`quantization_parts`). The sums behind it add up over chunks of
samples, so the judging streams them (analysis.own_error.sensitivity) instead of keeping
every reverted tensor.
"""

from __future__ import annotations

import numpy as np

GRIDS = {"int8": (-128, 127), "int16": (-32768, 32767)}
"""Integer range of each quantized output dtype."""


def quantization_parts(
    analysis: np.ndarray, reverted: np.ndarray, step: float, dtype: str | None
) -> tuple[float, float]:
    """(weight, activation) shares of a layer's own quantization error, mean |.| in its
    steps: ``reverted`` is the float layer on the quantized inputs, ``q(reverted)`` that
    value through the layer's own output quantizer (rounded to ``step``, clamped to
    ``dtype``'s range; an int32 or float output has none), so

        activation = mean |q(reverted) - reverted| / step   (output rounding, clipping)
        weight     = mean |analysis - q(reverted)| / step   (what is left: weights, bias)
    """
    return parts_from_sums(part_sums(analysis, reverted, step), step, dtype)


def part_sums(analysis: np.ndarray, reverted: np.ndarray, step: float) -> dict:
    """The sums behind :func:`quantization_parts` on some samples, for every output grid
    at once (the dtype may be known only later): ``{dtype or None: [sum |analysis - q|,
    sum |q - reverted|, elements]}``; sums of chunks add up to the sums of their union."""
    ref = np.asarray(reverted, np.float64)
    a = np.asarray(analysis, np.float64)
    out = {None: np.array([np.abs(a - ref).sum(), 0.0, ref.size])}
    for dtype, grid in GRIDS.items() if step > 0 else ():
        q = np.clip(np.round(ref / step), *grid) * step
        out[dtype] = np.array([np.abs(a - q).sum(), np.abs(q - ref).sum(), ref.size])
    return out


def parts_from_sums(sums: dict, step: float, dtype: str | None) -> tuple[float, float]:
    """(weight, activation) of :func:`quantization_parts` from :func:`part_sums`."""
    weight, activation, n = sums.get(dtype, sums[None]) if dtype in GRIDS else sums[None]
    if not step or not n:
        return 0.0, 0.0
    return float(weight / n / step), float(activation / n / step)
