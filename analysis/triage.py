"""Where to look when a stage pair diverges: the triage line of the localization.

Own errors come first, since a layer's total error may all be inherited; an input or the
model output is blamed only when it is compared and off itself, never for the position of
the first divergent layer (:func:`triage`). The float -> calibrate pair, the quantization
loss, has its own reading (:func:`quantization_triage`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.compare import OUTPUT, PairResult
from analysis.tolerance import EPS, limit, total_limit

if TYPE_CHECKING:
    from analysis.localize import PairVerdict


def triage(result: PairResult, v: PairVerdict, dtypes: dict[str, str]) -> str:
    """Where to look, from the first divergent layer's own error and the layers' total
    error on the whole split (a total error may be inherited, an own error is not):

    - an input (``input:*``) off in total -> the input data or preprocessing;
    - the first divergent layer adds more than the tolerance of its own -> a stage/op
      problem at that layer (also when it is the first or the output layer);
    - no layer off in total: the model output off -> its post-processing; else the
      errors within tolerance add up (:func:`_none_off`);
    - else the first layer off in total (its own error may lie on samples other than the
      judged ones): a stage/op problem there, its input being compared and not off; when
      no input is compared and it is the first layer, the input is a suspect too.
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
        return _none_off(result, v)
    layers = [i for i in result.layer_ids if not i.startswith("input:")]
    if off[0] == layers[0] and len(layers) == len(result.layer_ids):
        return (
            f"{off[0]}, the first layer, is off and the input is not compared: check the "
            f"input data or preprocessing, then a {result.analysis} stage/op problem at {off[0]}"
        )
    return f"{off[0]} is the first layer off: a {result.analysis} stage/op problem at {off[0]}"


def _none_off(result: PairResult, v: PairVerdict) -> str:
    """No layer off in total: the model output off past one int8 step of its range ->
    post-processing; else the pair diverged on errors within tolerance that add up (e.g.
    a top-1 drop from near-ties), the largest own error at ``v.first_layer``."""
    if result.aggregates[OUTPUT]["max_qscale_diff"] > limit(1.0, None):
        return "no layer is off, only the output: check post-processing of the model output"
    return (
        "no layer nor the output is off past the tolerance: errors within it add up; the "
        f"largest own error is at {v.first_layer}: a {result.analysis} stage/op problem there"
    )


def _off_in_total(result: PairResult, v: PairVerdict, dtypes: dict[str, str]) -> list[str]:
    """Layers (and inputs) whose total error on the whole split is past the tolerance
    (at least one step; an input: ``v.input_limit`` when set), in topological order."""
    tol = max(v.tolerance, 1.0)

    def allowed(lid: str) -> float:
        if lid.startswith("input:") and v.input_limit is not None:
            return v.input_limit + EPS
        stats, step = result.aggregates[lid], result.steps.get(lid, 0.0)
        return total_limit(tol, dtypes.get(lid), stats, step)

    return [
        lid for lid in result.layer_ids if result.aggregates[lid]["max_qscale_diff"] > allowed(lid)
    ]


def quantization_triage(result: PairResult, v: PairVerdict, over: list[str], cosine: float) -> str:
    """Where to look when the float -> calibrate pair diverges (the quantization loss): the
    first layer losing too much on its own, else a quantized input far from the float one
    (cosine under ``cosine``), else the loss adds up over layers that each stay within."""
    lid = v.first_layer
    if lid in over:
        return (
            f"{lid} loses the most to its own quantization (cosine {v.own.cosine[lid]:.5f}): "
            f"a {v.analysis} stage/op problem at {lid}: check its observer, scale (clipping) "
            "or bit width"
        )
    lost = [i for i in result.layer_ids if i.startswith("input:") and lost_input(result, i, cosine)]
    if lost:
        return f"the quantized input {lost[0]} is far from the float input: check its scale"
    return (
        "no layer loses much on its own, the loss adds up over the layers: check the "
        "quant section (observer, bit widths) or fine-tune with QAT"
    )


def lost_input(result: PairResult, lid: str, cosine: float) -> bool:
    """Whether the quantized input ``lid`` is far from the float one (cosine under ``cosine``)."""
    return result.aggregates[lid]["cosine"] < cosine
