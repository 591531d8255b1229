"""The vendor-style text files users know, written into the run's debug folder.

- compare_per_layer_out.txt / .csv: one row per layer with the vendor's columns (mod_name,
  base_op_type, analy_op_type, shape, quant_dtype, qscale, Cosine, MSE, L1, KL, SQNR, Atol,
  Rtol, base/analy min, max, mean, var, max_atol_diff, max_qscale_diff; formulas and the KL
  binning in analysis.metrics; shape: one sample's), plus our own-error column;
- output_<stage>_l1_sensitive_ops.txt: op_name, sensitive_type, op_type, L1 after reverting
  the op, L1 before, quant_dtype, flops (analysis.flops, ``N(x.xx%)``), most sensitive
  first (:func:`sensitive_type` says how the type is judged);
- abnormal_layer_advisor.txt: mod_name, op_type, abnormal_info, advice (:func:`_rules`,
  then analysis.advice's measured range flags and recommended overrides).
"""

from __future__ import annotations

import csv
import io
import math

from analysis.advice import Advice, advisor_lines
from analysis.compare import OUTPUT, PairResult
from analysis.flops import render_flops
from analysis.layer_graph import Layer
from analysis.localize import PairVerdict
from analysis.tolerance import limit

COLUMNS = (
    "mod_name", "base_op_type", "analy_op_type", "shape", "quant_dtype", "qscale", "Cosine",
    "MSE", "L1", "KL", "SQNR", "Atol", "Rtol", "base_min", "base_max", "base_mean",
    "base_var", "analy_min", "analy_max", "analy_mean", "analy_var", "max_atol_diff",
    "max_qscale_diff", "own_error_steps",
)  # fmt: skip
SOURCE = {
    "Cosine": "cosine", "MSE": "mse", "L1": "l1", "KL": "kl", "SQNR": "sqnr_db",
    "Atol": "max_abs", "Rtol": "rtol", "base_min": "base_min", "base_max": "base_max",
    "base_mean": "base_mean", "base_var": "base_var", "analy_min": "analysis_min",
    "analy_max": "analysis_max", "analy_mean": "analysis_mean", "analy_var": "analysis_var",
    "max_atol_diff": "max_abs", "max_qscale_diff": "max_qscale_diff",
}  # fmt: skip
WEIGHTED = ("conv", "linear")
"""Op types with weights of their own."""
INPUT_RANGE = 128.0
"""An int8 input whose values span this much (e.g. raw 0..255 pixels) gets a step >= 1."""
BULK_STEPS = 4.0
"""A layer's spread (standard deviation) must cover this many int16 steps: fewer, and no
quantization carries its range."""


def compare_rows(
    result: PairResult, layers: dict[str, Layer], dtypes: dict, verdict: PairVerdict | None
) -> list[dict]:
    """One row per compared layer (and the output) of a pair, vendor columns."""
    out = []
    for lid in [*result.layer_ids, OUTPUT]:
        agg = result.aggregates[lid]
        op = layers[lid].op_type if lid in layers else ("output" if lid == OUTPUT else "input")
        own = verdict.own.steps.get(lid) if verdict and verdict.own else None
        row = {"mod_name": lid, "base_op_type": op, "analy_op_type": op}
        row["shape"] = list(result.shapes.get(lid, ()))
        row |= {"quant_dtype": dtypes.get(lid, "float"), "qscale": result.steps[lid]}
        row |= {col: agg[src] for col, src in SOURCE.items()}
        row["own_error_steps"] = "" if own is None else own
        out.append(row)
    return out


def render_compare(rows: list[dict]) -> tuple[str, str]:
    """(txt, csv) of compare_per_layer_out."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    fmt = [f"{c}" for c in COLUMNS]
    lines = [" | ".join(fmt)]
    for r in rows:
        lines.append(" | ".join(_cell(r[c]) for c in COLUMNS))
    return "\n".join(lines) + "\n", buf.getvalue()


def _cell(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def render_sensitive(
    v: PairVerdict, layers: dict[str, Layer], dtypes: dict, flops: dict[str, int] | None = None
) -> str:
    """output_<stage>_l1_sensitive_ops.txt for a divergent pair (``flops``:
    analysis.flops.layer_flops; ``-`` where unknown)."""
    lines = [
        f"# {v.base} -> {v.analysis}: revert one op to {v.base}'s behaviour; output L1 vs "
        f"{v.base} before and after, most sensitive first",
        "op_name | sensitive_type | op_type | L1 | L1_before | quant_dtype | flops",
    ]
    for lid, before, after in v.sensitive:
        op = layers[lid].op_type if lid in layers else "input"
        kind = sensitive_type(v, lid, op, dtypes.get(lid))
        lines.append(
            f"{lid} | {kind} | {op} | {after:.6g} | {before:.6g} | {dtypes.get(lid, 'float')}"
            f" | {render_flops(lid, flops or {})}"
        )
    return "\n".join(lines) + "\n"


def sensitive_type(v: PairVerdict, lid: str, op: str, dtype: str | None) -> str:
    """``weight`` when the layer has weights (conv, linear) and adds more than the pair's
    tolerance of its own (own errors re-run the base layer on the analysis stage's inputs,
    so what remains comes from the layer's own parameters and arithmetic: weights, bias,
    requantize), else ``activation`` (its error arrives with its input activations or its
    output quantization). Judged from own errors, not by re-running the layer with float
    weights; without exact own errors (a simulator pair) every op is ``activation``."""
    own = v.own
    if op not in WEIGHTED or own is None or not own.exact or lid not in own.steps:
        return "activation"
    return "weight" if own.steps[lid] > limit(v.tolerance, dtype) else "activation"


def advisor(
    result: PairResult, layers: dict[str, Layer], dtypes: dict, advice: Advice | None = None
) -> str:
    """abnormal_layer_advisor.txt: the vendor's sanity rules (:func:`_rules`) over a pair's
    aggregate layer stats, then the ranges int8 cannot carry, ranked by what an int16
    override measurably restores (analysis.advice; none without ``advice``)."""
    lines = ["mod_name | op_type | abnormal_info | advice"]
    for lid in [*result.layer_ids, OUTPUT]:
        agg, op = result.aggregates[lid], layers[lid].op_type if lid in layers else lid
        for info, hint in _rules(lid, agg, dtypes.get(lid), result.steps[lid]):
            lines.append(f"{lid} | {op} | {info} | {hint}")
    if advice is not None:
        lines += advisor_lines(advice)
    if len(lines) == 1:
        lines.append("no abnormal layer found")
    return "\n".join(lines) + "\n"


def _rules(lid: str, agg: dict, dtype: str | None, step: float) -> list[tuple[str, str]]:
    """The vendor's sanity rules, one (abnormal_info, advice) per hit:

    - inf/nan values; an input not symmetric about 0;
    - an int8 input whose values span >= ``INPUT_RANGE`` -> consider int16;
    - range rules (:func:`_range_rules`): too large for any quantization, or a scale that
      does not cover the data;
    - a model output that is not high precision.

    Int16 for other layers is advised from measured trials only (analysis.advice): a rule
    on every layer's spread or error named nearly every layer of a transformer.
    """
    out = []
    if agg.get("base_nan_count", 0) or not all(
        abs(agg[k]) < float("inf") for k in ("base_min", "base_max", "analysis_min")
    ):
        out.append(("inf/nan values", "check the input data and the layer's arithmetic"))
    if lid.startswith("input:") and agg["base_min"] >= 0 and agg["base_max"] > 0:
        out.append(("input not symmetric about 0", "normalize the input symmetrically"))
    span = agg["base_max"] - agg["base_min"]
    if lid.startswith("input:") and dtype == "int8" and span >= INPUT_RANGE:
        out.append((f"input range {span:.4g} >= {INPUT_RANGE:g} in int8", "consider int16"))
    out += _range_rules(agg, dtype, step)
    if lid == OUTPUT and dtype in ("int8", "int16"):
        out.append(("model output is not high precision", "make the output high precision"))
    return out


def _range_rules(agg: dict, dtype: str | None, step: float) -> list[tuple[str, str]]:
    """Range rules of an int8/int16 layer, from its data range ``span = max - min``, its
    largest |value| ``top`` and spread (standard deviation ``std`` > 0; a constant tensor
    is exact), all of the base side:

    - too large for any quantization: the spread covers fewer than ``BULK_STEPS`` steps of
      an int16 grid over the range (``std < BULK_STEPS * span / 32767``) -> change the
      model (bound the values, e.g. a clamp or a norm);
    - the scale does not cover the data: ``top > 1.01 * step * qmax`` -> check fake quant.
    """
    if dtype not in ("int8", "int16"):
        return []
    out = []
    top = max(abs(agg["base_min"]), abs(agg["base_max"]))
    span = agg["base_max"] - agg["base_min"]
    std = math.sqrt(max(agg.get("base_var", 0.0), 0.0))
    if 0 < std < BULK_STEPS * span / 32767:
        info = f"data range too large for any quantization (range {span:.4g}, std {std:.3g})"
        out.append((info, "change the model to bound these values"))
    if top > 1.01 * step * (127 if dtype == "int8" else 32767):
        out.append(("scale does not cover the data range", "check fake quant is enabled"))
    return out
