"""The error a layer adds on its own, and what reverting it does to the final output.

Own error separates what a layer introduces from what it inherits: the *base* stage's
layer is run on the *analysis* stage's inputs (every layer of the base model is fed the
analysis model's captured values, so each base layer computes ``base_L(analysis inputs)``
in one run), and

    own_L = max |analysis_L - base_L(analysis inputs)| / step_L      (in quantization steps)

(and the cosine of ``analysis_L`` against ``base_L(analysis inputs)``, which judges the
float -> calibrate pair, where every layer adds its own quantization noise).

Sensitivity reverts one layer at a time: the analysis model runs with layer L replaced by
``base_L(analysis inputs)`` (L behaves as in the base stage, everything else as in the
analysis stage), and the improvement of the final output against the base output is

    improvement_L = L1(out_analysis, out_base) - L1(out_analysis with L reverted, out_base)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stages.stage_models import StageModel


@dataclass
class OwnErrors:
    """Per layer of a pair on a few samples: own error (steps) and the reverted value."""

    steps: dict[str, float]
    reverted: dict[str, np.ndarray]
    exact: bool
    """True when own errors come from re-running the base stage; False when the base
    cannot be fed layer by layer (the simulator), and the total error stands in for it
    (from the analysis stage's input when the base is ``feedable``)."""
    cosine: dict[str, float] = field(default_factory=dict)
    """Per layer: cosine of the analysis value against ``base_L(analysis inputs)``."""


def own_errors(
    base: StageModel,
    analysis: StageModel,
    idx: np.ndarray,
    layer_ids: list[str],
    steps: dict[str, float],
) -> OwnErrors:
    """Own error of every layer of ``layer_ids`` on samples ``idx`` (module docstring)."""
    _, ana = analysis.run(idx)
    if base.substitutable:
        _, computed = base.run(idx, replace={lid: ana[lid] for lid in layer_ids})
    else:  # a feedable program takes the analysis stage's input; any other, its own
        _, computed = base.run(
            idx, replace={k: v for k, v in ana.items() if k.startswith("input:")}
        )
    out = {
        lid: float(np.max(np.abs(ana[lid].astype(np.float64) - computed[lid]), initial=0.0))
        / steps[lid]
        for lid in layer_ids
    }
    cos = {lid: cosine(ana[lid], computed[lid]) for lid in layer_ids}
    return OwnErrors(out, {lid: computed[lid] for lid in layer_ids}, base.substitutable, cos)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors, flattened (1.0 when both are all zero)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norm == 0.0:
        return 1.0 if not (a.any() or b.any()) else 0.0
    return float(a @ b) / norm


def l1(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference."""
    return float(np.mean(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def sensitivity(
    base: StageModel,
    analysis: StageModel,
    idx: np.ndarray,
    own: OwnErrors,
    candidates: list[str],
    size: dict[str, float] | None = None,
) -> list[tuple[str, float, float]]:
    """(layer id, L1 before, L1 after reverting it) for each candidate, best first.

    Without substitution in the analysis model (the simulator), a layer's own error stands
    in: after = before * (1 - own / max own), an estimate, ranked the same way. ``size``
    (default ``own.steps``) is that own error in units comparable across layers, e.g. int8
    steps: raw steps of an int32 layer are far finer than an int8 layer's.
    """
    size = size or own.steps
    out_base, _ = base.run(idx)
    out_ana, _ = analysis.run(idx)
    before = l1(out_ana, out_base)
    rows = []
    worst = max((size[c] for c in candidates), default=0.0) or 1.0
    for lid in candidates:
        if analysis.substitutable and own.exact:
            out_rev, _ = analysis.run(idx, replace={lid: own.reverted[lid]})
            after = l1(out_rev, out_base)
        else:
            after = before * (1 - size[lid] / worst)
        rows.append((lid, before, after))
    return sorted(rows, key=lambda r: round(r[2] - r[1], 12))  # stable: ties in topo order
