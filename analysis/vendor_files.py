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
from analysis.localize import FLOAT_STAGE, PairVerdict
from analysis.quant_parts import GRIDS
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
FLOAT_PAIR = (FLOAT_STAGE, "calibrate")
"""The vendor's float-vs-calibration pair: the advisor's rules read its values."""
WEIGHTED = ("conv", "linear", "gemm")
"""Op types with weights of their own (gemm: a PTQ run's ONNX op)."""
INT8_RANGE = 128.0
"""An int8 layer whose values reach this magnitude (e.g. raw 0..255 pixels) gets a step
>= 1 (the vendor's "data range too large for int8")."""
INT16_RANGE = 32768.0
"""Values beyond this magnitude are too large for any quantization (the vendor's rule)."""
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
    v: PairVerdict,
    layers: dict[str, Layer],
    dtypes: dict,
    flops: dict[str, int] | None = None,
    parts: dict[str, tuple[float, float]] | None = None,
) -> str:
    """output_<stage>_l1_sensitive_ops.txt for a divergent pair (``flops``:
    analysis.flops.layer_flops, ``-`` where unknown; ``parts``: :func:`analysis.quant_parts.quantization_parts`
    of the float -> calibrate pair's weighted layers)."""
    lines = [
        f"# {v.base} -> {v.analysis}: revert one op to {v.base}'s behaviour; output L1 vs "
        f"{v.base} before and after, most sensitive first",
        f"# judged on {len(v.judged)} sample(s), not every frame: the pair's bad cases "
        f"and the probe samples ({', '.join(map(str, v.judged[:16]))}"
        f"{', ...' if len(v.judged) > 16 else ''})",
        "op_name | sensitive_type | op_type | L1 | L1_before | quant_dtype | flops",
    ]
    for lid, before, after in v.sensitive:
        op = layers[lid].op_type if lid in layers else "input"
        kind = sensitive_type(v, lid, op, dtypes.get(lid), parts)
        lines.append(
            f"{lid} | {kind} | {op} | {after:.6g} | {before:.6g} | {dtypes.get(lid, 'float')}"
            f" | {render_flops(lid, flops or {})}"
        )
    return "\n".join(lines) + "\n"


def sensitive_type(
    v: PairVerdict,
    lid: str,
    op: str,
    dtype: str | None,
    parts: dict[str, tuple[float, float]] | None = None,
) -> str:
    """``weight`` or ``activation``: which of a weighted layer's (conv, linear, gemm)
    quantizers its own error comes from; any other op is ``activation``.

    - float -> calibrate: the own error is split by :func:`analysis.quant_parts.quantization_parts` (``parts``);
      ``weight`` when the weights' share is the larger (a clipped or coarse output scale
      is ``activation``, an int32 output has no output quantizer);
    - a later pair, whose sides quantize the output alike: ``weight`` when the layer adds
      more than the pair's tolerance of its own (own errors re-run the base layer on the
      analysis stage's inputs, so what remains comes from its own parameters and
      arithmetic: weights, bias, requantize). Without exact own errors (a simulator
      pair) every op is ``activation``."""
    own = v.own
    if op not in WEIGHTED or own is None or not own.exact or lid not in own.steps:
        return "activation"
    if v.quantization:
        weight, activation = (parts or {}).get(lid, (0.0, 0.0))
        return "weight" if weight > activation else "activation"
    return "weight" if own.steps[lid] > limit(v.tolerance, dtype) else "activation"


def advisor_pair(pairs, top: tuple[str, str]) -> tuple[str, str]:
    """The pair whose values the advisor's rules read: float -> calibrate (the vendor's
    float-vs-calibration comparison: the float model's ranges against the calibrated
    scales) when the chain has it, else ``top`` (the first divergent or the last pair).
    Any later pair's base is already quantized: its values always fit their scales."""
    return FLOAT_PAIR if FLOAT_PAIR in set(pairs) else top


def advisor(
    result: PairResult, layers: dict[str, Layer], dtypes: dict, advice: Advice | None = None
) -> str:
    """abnormal_layer_advisor.txt: the vendor's sanity rules (:func:`_rules`) over a pair's
    aggregate layer stats (:func:`advisor_pair`), then the ranges int8 cannot carry,
    ranked by what an int16 override measurably restores (analysis.advice; none without
    ``advice``)."""
    lines = [
        f"# rules on {result.base} -> {result.analysis} (base and analysis values, every "
        "evaluation frame)",
        "mod_name | op_type | abnormal_info | advice",
    ]
    for lid in [*result.layer_ids, OUTPUT]:
        agg, op = result.aggregates[lid], layers[lid].op_type if lid in layers else lid
        for info, hint in _rules(lid, agg, dtypes.get(lid), result.steps[lid]):
            lines.append(f"{lid} | {op} | {info} | {hint}")
    if advice is not None:
        lines += advisor_lines(advice)
    if len(lines) == 2:
        lines.append("no abnormal layer found")
    return "\n".join(lines) + "\n"


def _rules(lid: str, agg: dict, dtype: str | None, step: float) -> list[tuple[str, str]]:
    """The vendor's sanity rules, one (abnormal_info, advice) per hit:

    - inf/nan values on either side; an input not symmetric about 0;
    - range rules (:func:`_range_rules`): values reaching ``INT8_RANGE`` in int8, too
      large for any quantization, a scale that does not cover the data;
    - a model output that is not high precision.

    Int16 for other layers is advised from measured trials only (analysis.advice): a rule
    on every layer's spread or error named nearly every layer of a transformer.
    """
    out = []
    ends = ("base_min", "base_max", "analysis_min", "analysis_max")
    nan = agg.get("base_nan_count", 0) or agg.get("analysis_nan_count", 0)
    if nan or not all(abs(agg[k]) < float("inf") for k in ends):
        out.append(("inf/nan values", "check the input data and the layer's arithmetic"))
    if lid.startswith("input:") and agg["base_min"] >= 0 and agg["base_max"] > 0:
        out.append(("input not symmetric about 0", "normalize the input symmetrically"))
    out += _range_rules(agg, dtype, step)
    if lid == OUTPUT and dtype in ("int8", "int16"):
        out.append(("model output is not high precision", "make the output high precision"))
    return out


def _range_rules(agg: dict, dtype: str | None, step: float) -> list[tuple[str, str]]:
    """Range rules of an int8/int16 layer, from ``top``, the largest ``|value|`` of both
    sides, the base's range ``span = max - min`` and spread (standard deviation ``std``
    > 0; a constant tensor is exact):

    - int8 values reaching ``top >= INT8_RANGE``: the step is then >= 1 -> consider int16;
    - too large for any quantization: ``top > INT16_RANGE``, or the spread covers fewer
      than ``BULK_STEPS`` steps of an int16 grid over the range
      (``std < BULK_STEPS * span / 32767``) -> change the model (bound the values);
    - the scale does not cover the data: the analysis side's values lie more than one
      step outside ``[qmin * step, qmax * step]``, which a working fake quant never lets
      through (calibration clipping a float range is not flagged) -> check fake quant.
    """
    if dtype not in ("int8", "int16"):
        return []
    out = []
    top = max(abs(agg[k]) for k in ("base_min", "base_max", "analysis_min", "analysis_max"))
    span = agg["base_max"] - agg["base_min"]
    std = math.sqrt(max(agg.get("base_var", 0.0), 0.0))
    if dtype == "int8" and top >= INT8_RANGE:
        out.append((f"data range reaches |x| {top:.4g} >= {INT8_RANGE:g} in int8 (a step "
                    f"of {top / 127:.3g} or more)", "consider int16"))  # fmt: skip
    if top > INT16_RANGE or 0 < std < BULK_STEPS * span / 32767:
        info = f"data range too large for any quantization (range {span:.4g}, std {std:.3g})"
        out.append((info, "change the model to bound these values"))
    qmin, qmax = GRIDS[dtype]
    if agg["analysis_min"] < (qmin - 1) * step or agg["analysis_max"] > (qmax + 1) * step:
        info = (f"scale does not cover the data range ([{agg['analysis_min']:.4g}, "
                f"{agg['analysis_max']:.4g}] past {qmax} steps of {step:.4g})")  # fmt: skip
        out.append((info, "check fake quant is enabled"))
    return out
