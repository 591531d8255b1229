"""Name the first divergent stage, the first divergent layer in it, and the sensitive ops.

- A stage pair (chain order) diverges when the analysis stage's primary metric
  (analysis.primary: ``compare.primary``, else top-1 with labels, else the output cosine
  against the float model) is worse than the base's by more than
  ``compare.thresholds.top1_drop`` (``primary_drop`` for a metric other than top-1), when the outputs' cosine falls under
  ``compare.thresholds.cosine``, or when some layer's own error (analysis.own_error, on
  the bad cases and the probe samples) is above the pair's tolerance:
  ``compare.thresholds.max_qscale_diff`` steps, and 0 for the pairs that must be
  bit-identical (convert -> compile, compile -> board_sim). The first such pair is the
  first divergent stage.
- float -> calibrate (prepare's model with every quantizer in FLOAT state against the
  first quantized model: the quantization loss itself) is judged by what quantization
  may cost: the top-1 drop, and a layer whose own quantization leaves a cosine under
  ``compare.thresholds.cosine`` (clipping or far too coarse scales; the int8 rounding
  noise of a layer stays far above it), or a quantized input under it. The output cosine
  is not judged there: every layer's expected noise adds up in it.
- compile -> board_sim behind a camera: compile's program is fed the board's own
  first-layer input, so every layer must match exactly, and the input itself may be off
  by the camera path's modelled rounding (:func:`camera_limit`), no more.
- Its first divergent layer is the first layer, in topological order, whose own error is
  above the tolerance (else a camera input past its limit, else the layer with the
  largest own error).
- Sensitive ops: each candidate reverted to the base stage's behaviour (own_error.sensitivity);
  a simulator pair, which cannot be re-run layer by layer, ranks by the estimate of
  analysis.sensitive_rank (the layer where the error enters before what amplifies it).
- Triage (analysis.triage) reads own errors first, since a layer's total error may all be
  inherited: an input off -> input or preprocessing; the first divergent layer adding more
  than the tolerance of its own -> a stage/op problem at that layer; no layer off, the
  output off -> post-processing; else the first layer off in total says where. An input
  or the output is blamed only when it is compared and off itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.compare import OUTPUT, PairResult
from analysis.layer_graph import Layer
from analysis.own_error import OwnErrors, own_errors, sensitivity
from analysis.primary import Primary
from analysis.sensitive_rank import in_int8_steps
from analysis.tolerance import EPS, limit
from analysis.tolerance import camera_limit as tolerance_camera_limit
from analysis.triage import lost_input, quantization_triage, triage
from stages.context import RunContext
from stages.stage_models import StageModel

FLOAT_STAGE = "prepare"
"""The float model's stage: prepare's model with every quantizer in FLOAT state."""
FLOAT_STAGES = {FLOAT_STAGE, "optimized"}
"""The float model of each chain (a PTQ run's: the optimized float ONNX), whose pair with
the first quantized model is the quantization loss."""
EXACT_PAIRS = {("convert", "compile"), ("compile", "board_sim"), ("quantized", "hbm"),
               ("hbm", "board")}  # fmt: skip
TOP_SENSITIVE = 10
JUDGED_PROBES = 4
"""Probe samples own errors are judged on whatever ``compare.probe_samples`` keeps."""


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
    judged: list[int] = field(default_factory=list)
    """The samples own errors and sensitivity were judged on (:func:`judged_samples`)."""
    input_limit: float | None = None
    """Steps the model input may be off in total (a camera's modelled rounding), if set."""

    @property
    def quantization(self) -> bool:
        """Whether this is the float -> first quantized stage pair (the quantization loss)."""
        return self.base in FLOAT_STAGES


def tolerance(ctx: RunContext, base: str, analysis: str) -> float:
    """Own error (steps) a layer may add in this pair; 0 where the pair must be exact
    (compile -> board_sim behind a camera too: compile is fed the board's own first-layer
    input, and the camera path is judged by :func:`camera_limit`)."""
    exact = (base, analysis) in EXACT_PAIRS
    return 0.0 if exact else ctx.spec.compare.thresholds.max_qscale_diff


def camera_limit(ctx: RunContext, step: float) -> float | None:
    """Steps the board's first-layer input may be off behind a camera (None: the board is
    fed featuremaps): the camera path's modelled rounding and the folded mean/std conv's,
    in input steps (:func:`analysis.tolerance.camera_limit`)."""
    return tolerance_camera_limit(ctx.spec, step)


def judged_samples(ctx: RunContext, samples: np.ndarray) -> np.ndarray:
    """The samples own errors are judged on: the bad cases and the probe samples, at least
    :data:`JUDGED_PROBES` of them (a fault that moves every sample alike need not be among
    the worst by output L1; ``compare.probe_samples: 0`` only keeps no full tensors)."""
    n = max(ctx.spec.compare.probe_samples, JUDGED_PROBES)
    probes = range(min(n, len(ctx.evaluation)))
    return np.asarray(list(dict.fromkeys([*map(int, samples), *probes])), dtype=np.int64)


def judge_pair(
    ctx: RunContext,
    models: dict[str, StageModel],
    result: PairResult,
    primary: Primary,
    samples: np.ndarray,
    dtypes: dict[str, str],
    layers: dict[str, Layer] | None = None,
) -> PairVerdict:
    """The verdict of one chain pair on its bad-case ``samples`` and the probe samples.

    Own errors are judged in int8 steps (analysis.tolerance.limit): an int16 layer may add
    256 times the tolerance in its own (256x finer) steps. The float -> calibrate pair is
    judged by :func:`_quantization_over` instead. ``layers`` (their producers) rank the
    sensitive ops when only total errors are known (analysis.sensitive_rank)."""
    v = PairVerdict(result.base, result.analysis, samples=[int(i) for i in samples])
    v.tolerance = tolerance(ctx, result.base, result.analysis)
    if (result.base, result.analysis) == ("compile", "board_sim"):
        v.input_limit = camera_limit(ctx, result.steps.get(_input(result), 0.0))
    v.reasons += _output_reasons(ctx, result, primary, v)
    ids = [i for i in result.layer_ids if not i.startswith("input:")]
    base, ana = models[result.base], models[result.analysis]
    judged = judged_samples(ctx, samples)
    v.judged = [int(i) for i in judged]
    v.own = own_errors(base, ana, judged, ids, result.steps)
    th = ctx.spec.compare.thresholds
    if v.quantization:
        over = _quantization_over(v, ids, th.cosine)
    else:
        over = [i for i in ids if v.own.steps[i] > limit(v.tolerance, dtypes.get(i))]
        if over:
            v.reasons.append(
                f"{len(over)} layer(s) add more than {v.tolerance:g} step(s) of their own, "
                f"first {over[0]} ({v.own.steps[over[0]]:.3g})"
            )
    if v.reasons:
        _localize(v, result, (base, ana), judged, ids, over, dtypes, layers or {}, th.cosine)
    base.forget()  # the cut graphs own errors and sensitivity ran
    ana.forget()
    return v


def _input(result: PairResult) -> str | None:
    return next((i for i in result.layer_ids if i.startswith("input:")), None)


def _output_reasons(ctx: RunContext, result: PairResult, primary: Primary, v: PairVerdict) -> list:
    """The primary metric's worsening and output cosine (not for the float pair, whose output carries every
    layer's quantization noise), and a camera input past its modelled rounding."""
    th, out = ctx.spec.compare.thresholds, []
    worse = primary.reason(result.base, result.analysis)
    out += [worse] if worse else []
    cos = result.aggregates[OUTPUT]["cosine"]
    if cos < th.cosine and not v.quantization:
        out.append(f"output cosine {cos:.5f} (< {th.cosine})")
    inp = _input(result)
    if v.quantization and inp is not None and lost_input(result, inp, th.cosine):
        out.append(f"quantized input {inp} cosine {result.aggregates[inp]['cosine']:.5f} "
                   f"(< {th.cosine})")  # fmt: skip
    if v.input_limit is not None and inp is not None:
        off = result.aggregates[inp]["max_qscale_diff"]
        if off > v.input_limit + EPS:
            out.append(
                f"camera input {inp} off by {off:.3g} steps (> {v.input_limit:.3g}, "
                "the camera path's modelled rounding)"
            )
    return out


def _quantization_over(v: PairVerdict, ids: list[str], cosine: float) -> list[str]:
    """float -> calibrate: the layers whose own quantization (output rounding, clipping,
    weight rounding: the float layer fed the same quantized inputs) leaves a cosine under
    ``compare.thresholds.cosine``. int8 rounding noise alone stays far above the default
    0.999 (SQNR about 27 dB); a clipping or far too coarse scale falls below it."""
    over = [i for i in ids if v.own.cosine[i] < cosine]
    if over:
        v.reasons.append(
            f"{len(over)} layer(s) lose more than cosine {cosine:g} to their own "
            f"quantization, first {over[0]} (cosine {v.own.cosine[over[0]]:.5f})"
        )
    return over


def _localize(v, result, models, idx, ids, over, dtypes, layers, cosine) -> None:
    """First divergent layer, sensitive ops and triage of a divergent pair."""
    if v.quantization:
        size = {i: 1.0 - v.own.cosine[i] for i in ids}
    else:
        size = in_int8_steps(result, v.own, dtypes, layers, over)
    camera = [r for r in v.reasons if r.startswith("camera input")]
    v.first_layer = over[0] if over else (_input(result) if camera else None)
    v.first_layer = v.first_layer or max(ids, key=size.__getitem__)
    ranked = set(sorted(ids, key=lambda i: -size[i])[:TOP_SENSITIVE]) | {v.first_layer}
    candidates = [i for i in ids if i in ranked]
    steps = result.steps if v.quantization else None  # the weight/activation split's
    v.sensitive = sensitivity(*models, idx, v.own, candidates, size, steps)
    if v.quantization:
        v.triage = quantization_triage(result, v, over, cosine)
    else:
        v.triage = triage(result, v, dtypes)


def first_divergence(verdicts: list[PairVerdict]) -> PairVerdict | None:
    """The first pair, in chain order, that diverges."""
    return next((v for v in verdicts if v.reasons), None)
