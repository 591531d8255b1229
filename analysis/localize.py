"""Name the first divergent stage, the first divergent layer in it, and the sensitive ops.

- A stage pair (chain order) diverges when the analysis stage's top-1 is more than
  ``compare.thresholds.top1_drop`` below the base's, when the outputs' cosine falls under
  ``compare.thresholds.cosine``, or when some layer's own error (analysis.own_error) is
  above the pair's tolerance: ``compare.thresholds.max_qscale_diff`` steps, and 0 for the
  pairs that must be bit-identical (convert -> compile, compile -> board_sim fed
  featuremaps). The first such pair is the first divergent stage.
- Its first divergent layer is the first layer, in topological order, whose own error is
  above the tolerance (else the layer with the largest own error).
- Triage reads own errors first, since a layer's total error may all be inherited: an
  input off -> input or preprocessing; the first divergent layer adding more than the
  tolerance of its own -> a stage/op problem at that layer; no layer off, only the output
  -> post-processing; else the first layer off in total says where (see :func:`triage`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.compare import OUTPUT, PairResult
from analysis.layer_graph import Layer
from analysis.own_error import OwnErrors, own_errors, sensitivity
from analysis.tolerance import factor, limit, span_of, total_limit
from stages.context import RunContext
from stages.stage_models import StageModel

EXACT_PAIRS = {("convert", "compile"), ("compile", "board_sim"), ("quantized", "hbm"),
               ("hbm", "board")}  # fmt: skip
TOP_SENSITIVE = 10


@dataclass
class PairVerdict:
    """Why a pair diverges (empty ``reasons``: it does not)."""

    base: str
    analysis: str
    reasons: list[str] = field(default_factory=list)
    own: OwnErrors | None = None
    tolerance: float = 0.0
    first_layer: str | None = None
    sensitive: list[tuple[str, float, float]] = field(default_factory=list)
    triage: str = ""
    samples: list[int] = field(default_factory=list)


def tolerance(ctx: RunContext, base: str, analysis: str) -> float:
    """Own error (steps) a layer may add in this pair; 0 where the pair must be exact."""
    camera = ctx.spec.stages.board_sim.runtime_format != "featuremap"
    exact = (base, analysis) in EXACT_PAIRS and not (analysis == "board_sim" and camera)
    return 0.0 if exact else ctx.spec.compare.thresholds.max_qscale_diff


def judge_pair(
    ctx: RunContext,
    models: dict[str, StageModel],
    result: PairResult,
    top1: dict[str, float],
    samples: np.ndarray,
    dtypes: dict[str, str],
    layers: dict[str, Layer] | None = None,
) -> PairVerdict:
    """The verdict of one chain pair on its bad-case ``samples``.

    Own errors are judged in int8 steps (analysis.tolerance.limit): an int16 layer may add
    256 times the tolerance in its own (256x finer) steps. ``layers`` (their producers)
    rank the sensitive ops when only total errors are known (:func:`in_int8_steps`)."""
    th = ctx.spec.compare.thresholds
    v = PairVerdict(result.base, result.analysis, samples=[int(i) for i in samples])
    v.tolerance = tolerance(ctx, result.base, result.analysis)
    drop = top1.get(result.base, np.nan) - top1.get(result.analysis, np.nan)
    if drop > th.top1_drop:
        v.reasons.append(f"top-1 drops {drop:.4f} (> {th.top1_drop})")
    cos = result.aggregates[OUTPUT]["cosine"]
    if cos < th.cosine:
        v.reasons.append(f"output cosine {cos:.5f} (< {th.cosine})")
    ids = [i for i in result.layer_ids if not i.startswith("input:")]
    base, ana = models[result.base], models[result.analysis]
    v.own = own_errors(base, ana, samples, ids, result.steps)
    over = [i for i in ids if v.own.steps[i] > limit(v.tolerance, dtypes.get(i))]
    if over:
        v.reasons.append(
            f"{len(over)} layer(s) add more than {v.tolerance:g} step(s) of their own, "
            f"first {over[0]} ({v.own.steps[over[0]]:.3g})"
        )
    if v.reasons:
        size = in_int8_steps(result, v.own, dtypes, layers or {})
        v.first_layer = over[0] if over else max(ids, key=size.__getitem__)
        ranked = set(sorted(ids, key=lambda i: -size[i])[:TOP_SENSITIVE]) | {v.first_layer}
        candidates = [i for i in ids if i in ranked]
        v.sensitive = sensitivity(base, ana, samples, v.own, candidates, size)
        v.triage = triage(result, v, dtypes)
    return v


def in_int8_steps(
    result: PairResult, own: OwnErrors, dtypes: dict[str, str], layers: dict[str, Layer]
) -> dict[str, float]:
    """Own errors in int8 steps (an int32 accumulator's: in 1/127 of its range), so layers
    of different dtypes rank together: raw steps of an int16 or int32 layer are far finer
    than an int8 layer's. When total errors stand in (``own.exact`` False), each layer
    keeps only what it adds to the largest error upstream of it (:func:`_upstream`): a
    total error carries everything upstream, which would rank the last layers first."""
    size = {
        lid: steps / factor(dtypes.get(lid), span_of(result.aggregates[lid], result.steps[lid]))
        for lid, steps in own.steps.items()
    }
    if own.exact:
        return size
    return {lid: max(s - _upstream(lid, size, layers), 0.0) for lid, s in size.items()}


def _upstream(lid: str, size: dict[str, float], layers: dict[str, Layer]) -> float:
    """The largest ``size`` among the nearest layers upstream of ``lid`` that have one
    (a layer the stage does not capture, e.g. a conv fused with its relu, is passed
    through to its own producers)."""
    found, todo, seen = 0.0, list(layers[lid].producers) if lid in layers else [], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if p in size:
            found = max(found, size[p])
        elif p in layers:
            todo += layers[p].producers
    return found


def triage(result: PairResult, v: PairVerdict, dtypes: dict[str, str]) -> str:
    """Where to look, from the first divergent layer's own error and the layers' total
    error on the whole split (a total error may be inherited, an own error is not):

    - an input (``input:*``) off in total -> the input data or preprocessing;
    - the first divergent layer adds more than the tolerance of its own -> a stage/op
      problem at that layer (also when it is the first or the output layer);
    - no layer off in total, only the model output -> post-processing of the output;
    - else the first layer off in total: when it is the first compared layer and own
      errors are exact, it only passes on what its inputs bring (input or preprocessing);
      otherwise a stage/op problem there.
    """
    off = _off_in_total(result, v, dtypes)
    if any(lid.startswith("input:") for lid in off):
        return "the input is off: check the input data or preprocessing"
    lid, own = v.first_layer, v.own
    if own.exact and lid in own.steps and own.steps[lid] > limit(v.tolerance, dtypes.get(lid)):
        return (
            f"{lid} adds {own.steps[lid]:.3g} step(s) of its own: "
            f"a {result.analysis} stage/op problem at {lid}"
        )
    if not off:
        return "no layer is off, only the output: check post-processing of the model output"
    layers = [i for i in result.layer_ids if not i.startswith("input:")]
    if own.exact and off[0] == layers[0]:
        return (
            f"every layer is off from {off[0]} on and none adds error of its own: "
            "check the input data or preprocessing"
        )
    return f"{off[0]} is the first layer off: a {result.analysis} stage/op problem at {off[0]}"


def _off_in_total(result: PairResult, v: PairVerdict, dtypes: dict[str, str]) -> list[str]:
    """Layers (and inputs) whose total error on the whole split is past the tolerance
    (at least one step), in topological order."""
    tol = max(v.tolerance, 1.0)
    return [
        lid
        for lid in result.layer_ids
        if result.aggregates[lid]["max_qscale_diff"]
        > total_limit(tol, dtypes.get(lid), result.aggregates[lid], result.steps.get(lid, 0.0))
    ]


def first_divergence(verdicts: list[PairVerdict]) -> PairVerdict | None:
    """The first pair, in chain order, that diverges."""
    return next((v for v in verdicts if v.reasons), None)
