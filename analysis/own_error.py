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

from analysis.quant_parts import part_sums
from stages.stage_models import StageModel


@dataclass
class OwnErrors:
    """Per layer of a pair on a few samples: own error (steps), and for the sensitivity
    candidates of a quantization pair the sums splitting it into weight and activation
    shares (analysis.quant_parts.part_sums, streamed: no reverted tensor is kept)."""

    steps: dict[str, float]
    parts: dict[str, dict]
    exact: bool
    """True when own errors come from re-running the base stage; False when the base
    cannot be fed layer by layer (the simulator), and the total error stands in for it
    (from the analysis stage's input when the base is ``feedable``)."""
    cosine: dict[str, float] = field(default_factory=dict)
    """Per layer: cosine of the analysis value against ``base_L(analysis inputs)``."""


CHUNK = 1
"""Samples per model run while judging: every layer of one 224x224 ResNet-50 sample is
about 100 MB per model, and a pair holds three runs' worth (analysis, base, reverted)."""


def chunks(idx: np.ndarray) -> list[np.ndarray]:
    """``idx`` in consecutive runs of at most :data:`CHUNK` samples."""
    return [idx[a : a + CHUNK] for a in range(0, len(idx), CHUNK)]


def own_errors(
    base: StageModel,
    analysis: StageModel,
    idx: np.ndarray,
    layer_ids: list[str],
    steps: dict[str, float],
) -> OwnErrors:
    """Own error of every layer of ``layer_ids`` on samples ``idx`` (module docstring),
    streamed over :func:`chunks`: the max over samples, the cosine from summed dot
    products. ``parts`` stays empty: :func:`sensitivity` fills its candidates'."""
    worst = dict.fromkeys(layer_ids, 0.0)
    dots = {lid: np.zeros(3) for lid in layer_ids}  # <a, b>, <a, a>, <b, b>
    for part in chunks(idx):
        _, ana, computed = _base_on_analysis(base, analysis, part, layer_ids)
        for lid in layer_ids:
            a, b = (
                ana[lid].astype(np.float64).ravel(),
                np.asarray(computed[lid], np.float64).ravel(),
            )
            worst[lid] = max(worst[lid], float(np.max(np.abs(a - b), initial=0.0)))
            dots[lid] += (a @ b, a @ a, b @ b)
    out = {lid: worst[lid] / steps[lid] for lid in layer_ids}
    cos = {lid: _cosine_of(*dots[lid]) for lid in layer_ids}
    return OwnErrors(out, {}, base.substitutable, cos)


def _base_on_analysis(base: StageModel, analysis: StageModel, idx, layer_ids: list[str]):
    """(analysis output, analysis layers, base layers computed from the analysis stage's
    values) on ``idx``: every base layer fed the analysis values (substitutable), else the
    base fed the analysis stage's input (a feedable program) or its own."""
    out, ana = analysis.run(idx)
    if base.substitutable:
        _, computed = base.run(idx, replace={lid: ana[lid] for lid in layer_ids})
    else:
        _, computed = base.run(
            idx, replace={k: v for k, v in ana.items() if k.startswith("input:")}
        )
    return out, ana, computed


def _cosine_of(ab: float, aa: float, bb: float) -> float:
    """The cosine from dot products (1.0 when both are all zero, 0.0 when one is)."""
    norm = float(np.sqrt(aa * bb))
    if norm == 0.0:
        return 1.0 if aa == bb == 0.0 else 0.0
    return float(ab) / norm


def sensitivity(
    base: StageModel,
    analysis: StageModel,
    idx: np.ndarray,
    own: OwnErrors,
    candidates: list[str],
    size: dict[str, float] | None = None,
    quant_steps: dict[str, float] | None = None,
) -> list[tuple[str, float, float]]:
    """(layer id, L1 before, L1 after reverting it) for each candidate, best first. With
    ``quant_steps`` (layer id -> output step: the quantization pair), each candidate's
    weight/activation sums over ``idx`` land in ``own.parts``.

    Without substitution in the analysis model (the simulator), a layer's own error stands
    in: after = before * (1 - own / max own), an estimate, ranked the same way. ``size``
    (default ``own.steps``) is that own error in units comparable across layers, e.g. int8
    steps: raw steps of an int32 layer are far finer than an int8 layer's. Streamed over
    :func:`chunks`; L1 is summed over them and divided once. The reverted runs go one
    candidate at a time over every chunk (a graph runner cut for a candidate is built once,
    not once per chunk), on the candidates' reverted values kept from the first pass.
    """
    size = size or own.steps
    revert = analysis.substitutable and own.exact
    parts, outs, kept, before, n = chunks(idx), [], [], 0.0, 0
    for part in parts:
        out_base = base.output(part)
        if revert:  # the analysis output comes with the capture the reverted values need
            out_ana, reverted = _reverted(base, analysis, part, own, candidates, quant_steps)
            outs.append(out_base)
            kept.append(reverted)
        else:
            out_ana = analysis.output(part)
        before += _l1_sum(out_ana, out_base)
        n += np.size(out_base)
    after = _after_reverting(analysis, candidates, parts, kept, outs, n) if revert else {}
    before /= max(n, 1)
    worst = max((size[c] for c in candidates), default=0.0) or 1.0
    rows = [(lid, before, after[lid] if revert else before * (1 - size[lid] / worst))
            for lid in candidates]  # fmt: skip
    return sorted(rows, key=lambda r: round(r[2] - r[1], 12))  # stable: ties in topo order


def _reverted(base, analysis, part, own: OwnErrors, candidates, quant_steps):
    """(the analysis output, the candidates' base values computed from the analysis
    stage's inputs) on ``part`` (copies: the rest of both captures is freed), their
    weight/activation sums added to ``own.parts`` when ``quant_steps`` is given."""
    out, ana, computed = _base_on_analysis(base, analysis, part, list(own.steps))
    for lid in candidates if quant_steps is not None else ():
        _add_parts(own.parts, lid, ana[lid], computed[lid], quant_steps[lid])
    return out, {lid: np.array(computed[lid]) for lid in candidates}


def _after_reverting(analysis: StageModel, candidates, parts, kept, outs, n: int) -> dict:
    """Per candidate: the mean L1 of the analysis output with it reverted to its ``kept``
    value (one dict per chunk of ``parts``) against the base output ``outs``, every chunk
    of one candidate before the next."""
    return {
        lid: sum(_l1_sum(analysis.output(part, replace={lid: rev[lid]}), out)
                 for part, rev, out in zip(parts, kept, outs, strict=True)) / max(n, 1)
        for lid in candidates
    }  # fmt: skip


def _add_parts(parts: dict, lid: str, value, reverted, step: float) -> None:
    """Add one chunk's weight/activation sums of layer ``lid`` to ``parts`` (a layer whose
    two tensors differ in shape has none)."""
    if np.shape(value) != np.shape(reverted):
        return
    sums = part_sums(value, reverted, step)
    if lid in parts:
        sums = {k: parts[lid][k] + v for k, v in sums.items()}
    parts[lid] = sums


def _l1_sum(a: np.ndarray, b: np.ndarray) -> float:
    """Sum of absolute differences (float64)."""
    return float(np.sum(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
