"""The vendor-style text files users know, written into the run's debug folder.

- compare_per_layer_out.txt / .csv: one row per layer with the vendor's columns (mod_name,
  base_op_type, analy_op_type, shape, quant_dtype, qscale, Cosine, MSE, L1, SQNR, Atol,
  base/analy min, max, mean, max_atol_diff, max_qscale_diff), plus our own-error column;
- output_<stage>_l1_sensitive_ops.txt: op_name, sensitive_type, op_type, L1 after reverting
  the op, quant_dtype, sorted most sensitive first;
- abnormal_layer_advisor.txt: mod_name, op_type, abnormal_info, advice.
KL, Rtol, var and flops of the vendor's files are not computed (no column is faked).
"""

from __future__ import annotations

import csv
import io

from analysis.compare import OUTPUT, PairResult
from analysis.layer_graph import Layer
from analysis.localize import PairVerdict

COLUMNS = (
    "mod_name", "base_op_type", "analy_op_type", "quant_dtype", "qscale", "Cosine", "MSE",
    "L1", "SQNR", "Atol", "base_min", "base_max", "base_mean", "analy_min", "analy_max",
    "analy_mean", "max_atol_diff", "max_qscale_diff", "own_error_steps",
)  # fmt: skip
SOURCE = {
    "Cosine": "cosine", "MSE": "mse", "L1": "l1", "SQNR": "sqnr_db", "Atol": "max_abs",
    "base_min": "base_min", "base_max": "base_max", "base_mean": "base_mean",
    "analy_min": "analysis_min", "analy_max": "analysis_max", "analy_mean": "analysis_mean",
    "max_atol_diff": "max_abs", "max_qscale_diff": "max_qscale_diff",
}  # fmt: skip


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


def render_sensitive(v: PairVerdict, layers: dict[str, Layer], dtypes: dict) -> str:
    """output_<stage>_l1_sensitive_ops.txt for a divergent pair."""
    lines = [
        f"# {v.base} -> {v.analysis}: revert one op to {v.base}'s behaviour; output L1 vs "
        f"{v.base} before and after, most sensitive first",
        "op_name | sensitive_type | op_type | L1 | L1_before | quant_dtype",
    ]
    for lid, before, after in v.sensitive:
        op = layers[lid].op_type if lid in layers else "input"
        lines.append(
            f"{lid} | activation | {op} | {after:.6g} | {before:.6g} | {dtypes.get(lid, 'float')}"
        )
    return "\n".join(lines) + "\n"


def advisor(result: PairResult, layers: dict[str, Layer], dtypes: dict) -> str:
    """abnormal_layer_advisor.txt: the vendor's rules over a pair's aggregate layer stats."""
    lines = ["mod_name | op_type | abnormal_info | advice"]
    for lid in [*result.layer_ids, OUTPUT]:
        agg, op = result.aggregates[lid], layers[lid].op_type if lid in layers else lid
        for info, advice in _rules(lid, agg, dtypes.get(lid), result.steps[lid]):
            lines.append(f"{lid} | {op} | {info} | {advice}")
    if len(lines) == 1:
        lines.append("no abnormal layer found")
    return "\n".join(lines) + "\n"


def _rules(lid: str, agg: dict, dtype: str | None, step: float) -> list[tuple[str, str]]:
    out = []
    if agg.get("base_nan_count", 0) or not all(
        abs(agg[k]) < float("inf") for k in ("base_min", "base_max", "analysis_min")
    ):
        out.append(("inf/nan values", "check the input data and the layer's arithmetic"))
    if lid.startswith("input:") and agg["base_min"] >= 0 and agg["base_max"] > 0:
        out.append(("input not symmetric about 0", "normalize the input symmetrically"))
    if dtype == "int8" and agg["max_qscale_diff"] > 4:
        out.append(
            (f"{agg['max_qscale_diff']:.3g} steps off (int8)", "consider int16 for this layer")
        )
    if dtype in ("int8", "int16") and max(abs(agg["base_min"]), abs(agg["base_max"])) > 1.01 * (
        step * (127 if dtype == "int8" else 32767)
    ):
        out.append(("scale does not cover the data range", "check fake quant is enabled"))
    if lid == OUTPUT and dtype in ("int8", "int16"):
        out.append(("model output is not high precision", "make the output high precision"))
    return out
