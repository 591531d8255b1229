"""Rows of the localization and sensitivity tables, and the few full tensors kept.

``localization`` is long format: one ``stage`` row per chain pair (the divergent pairs
ranked 1, 2, ... in chain order, so rank 1 is the first divergent stage; 0 for a pair within
thresholds; its ``value`` the largest own error, ``detail`` the reasons), one ``layer``
row for the first divergent layer, ``sensitive`` rows (rank order) and a ``triage`` row.
``layer_tensors`` keeps full tensors only for the probe samples and the first divergent
pair's worst bad cases, never for the whole dataset.
"""

from __future__ import annotations

import numpy as np

from analysis.compare import PairResult
from analysis.layer_graph import Layer
from analysis.localize import PairVerdict
from schemas.table_digests import remove_parts
from schemas.tables import float32_lists, write_columns
from stages.context import RunContext
from stages.stage_models import StageModel

TENSOR_BADCASES = 3


def _row(run_id: str, kind: str, rank: int, v: PairVerdict, **kw) -> dict:
    row = {"run_id": run_id, "kind": kind, "rank": rank, "stage": v.analysis}
    row |= {"base_stage": v.base, "layer_id": None, "op_type": None, "metric": None}
    row |= {"value": None, "threshold": v.tolerance, "detail": None}
    return row | kw


def localization_rows(
    run_id: str, verdicts: list[PairVerdict], first: PairVerdict | None, layers: dict[str, Layer]
) -> list[dict]:
    """The localization table of one run."""
    rows, divergent = [], 0
    for v in verdicts:
        worst = max(v.own.steps.values(), default=0.0) if v.own else 0.0
        status = "; ".join(v.reasons) if v.reasons else "within thresholds"
        divergent += bool(v.reasons)  # a passing pair in between does not restart the count
        rank = divergent if v.reasons else 0
        rows.append(
            _row(run_id, "stage", rank, v, metric="own_error_steps", value=worst, detail=status)
        )
    if first is None:
        return rows
    lid = first.first_layer
    op = layers[lid].op_type if lid in layers else "input"
    own = first.own.steps.get(lid)  # None: the input, judged by its total error
    rows.append(
        _row(
            run_id, "layer", 1, first, layer_id=lid, op_type=op, metric="own_error_steps", value=own
        )
    )
    for i, (sid, before, after) in enumerate(first.sensitive, start=1):
        op = layers[sid].op_type if sid in layers else "input"
        rows.append(
            _row(
                run_id,
                "sensitive",
                i,
                first,
                layer_id=sid,
                op_type=op,
                metric="l1_improvement",
                value=before - after,
            )
        )
    rows.append(_row(run_id, "triage", 1, first, layer_id=lid, detail=first.triage))
    return rows


def sensitivity_rows(
    run_id: str, verdicts: list[PairVerdict], layers: dict[str, Layer]
) -> list[dict]:
    """The sensitivity table: every divergent pair's ranking."""
    out = []
    for v in verdicts:
        for rank, (lid, before, after) in enumerate(v.sensitive, start=1):
            layer = layers.get(lid)
            out.append({
                "run_id": run_id, "base_stage": v.base, "analysis_stage": v.analysis,
                "metric": "l1", "target": "layer", "layer_id": lid,
                "op_type": layer.op_type if layer else "input",
                "topo_index": layer.topo_index if layer else -1, "rank": rank,
                "before": before, "after": after, "improvement": before - after,
            })  # fmt: skip
    return out


def trial_rows(run_id: str, advice, layers: dict[str, Layer]) -> list[dict]:
    """Sensitivity rows of the int16 trials (analysis.advice; target ``int16``, layer_id:
    the overrides tried, ``improvement``: the gain, positive when it restores)."""
    out = []
    for rank, t in enumerate(advice.trials if advice else [], start=1):
        layer = layers.get(t.target)
        out.append({
            "run_id": run_id, "base_stage": "prepare", "analysis_stage": "calibrate",
            "metric": t.metric, "target": "int16", "layer_id": ",".join(t.keys),
            "op_type": layer.op_type if layer else "group",
            "topo_index": layer.topo_index if layer else -1, "rank": rank,
            "before": t.before, "after": t.after, "improvement": t.gain,
        })  # fmt: skip
    return out


def write_tensors(
    ctx: RunContext,
    models: dict[str, StageModel],
    results: dict[tuple[str, str], PairResult],
    first: PairVerdict | None,
    layers: dict[str, Layer],
) -> None:
    """Full tensors of the probe samples (first pair) and of the divergent pair's bad cases,
    one part per sample and side (``<reason>-<side>-<sample>``: a 224x224 network's layers
    are 50-150 MB a sample, so memory holds one sample's), column-wise: the values go to
    Arrow as one float32 buffer, never as Python floats."""
    pair = (first.base, first.analysis) if first else next(iter(results))
    probes = list(range(min(ctx.spec.compare.probe_samples, len(ctx.evaluation))))
    bad = first.samples[:TENSOR_BADCASES] if first else []
    remove_parts(ctx.run, "tables/layer_tensors")  # this analysis' parts replace all others
    written = 0
    for reason, ids in (("probe", probes), ("badcase", bad)):
        for side, stage in (("base", pair[0]), ("analysis", pair[1])):
            for sid in ids:
                _, values = models[stage].run(np.asarray([sid]))
                cols = _tensor_columns(ctx, results[pair], values, (reason, side, int(sid)))
                write_columns(ctx.run, "layer_tensors", cols, f"{reason}-{side}-{sid:06d}")
                written += 1
    if not written:  # the table still exists for the run, empty
        write_columns(
            ctx.run, "layer_tensors", _tensor_columns(ctx, results[pair], {}, None), "all"
        )


def _tensor_columns(ctx: RunContext, result: PairResult, values: dict, where) -> dict:
    """The layer_tensors columns of one sample's ``values`` (``where``: reason, side,
    sample id; None with no values: no rows)."""
    lids = result.layer_ids if where else []
    tensors = [np.asarray(values[lid][0], dtype=np.float32) for lid in lids]
    reason, side, sid = where or ("", "", 0)
    n = len(tensors)
    return {
        "run_id": [ctx.run.run_id] * n, "base_stage": [result.base] * n,
        "analysis_stage": [result.analysis] * n, "layer_id": list(lids),
        "sample_id": [sid] * n, "reason": [reason] * n, "side": [side] * n,
        "shape": [list(t.shape) for t in tensors],
        "scale": [result.steps[lid] for lid in lids], "values": float32_lists(tensors),
    }  # fmt: skip
