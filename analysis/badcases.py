"""Bad cases: the samples whose outputs differ most between two stages (auto_find_bad_case).

Metrics (per sample, on the final output): ``l1`` (default, the vendor's), ``mse``,
``cosine`` (lowest first), ``sqnr`` (lowest first), ``flip`` (the task's correctness
changed: right in one stage, wrong in the other; ties broken by L1).
"""

from __future__ import annotations

import numpy as np

from analysis.compare import PairResult
from schemas.errors import SpecError

ORDER = {"l1": -1, "mse": -1, "cosine": 1, "sqnr": 1, "flip": -1}
"""-1: larger is worse; 1: smaller is worse."""


def select(result: PairResult, metric: str = "l1", k: int = 10) -> list[tuple[int, float]]:
    """(sample id, metric value) of the ``k`` worst samples of a pair, worst first."""
    if metric not in ORDER:
        raise SpecError(
            f"unknown bad-case metric {metric!r}",
            where="compare.badcase_metric",
            hint=f"use one of: {', '.join(ORDER)}",
        )
    key = "sqnr_db" if metric == "sqnr" else metric
    values = result.per_sample(key)
    ids = result.per_sample("sample_id")
    tiebreak = result.per_sample("l1")
    order = np.lexsort((-tiebreak, ORDER[metric] * values))
    return [(int(ids[i]), float(values[i])) for i in order[:k]]


def rows(result: PairResult, picked: list[tuple[int, float]], metric: str) -> list[dict]:
    """Rows of the ``badcases`` table."""
    pos = {int(s): i for i, s in enumerate(result.per_sample("sample_id"))}
    label, bp, ap = (result.per_sample(k) for k in ("label", "base_pred", "analysis_pred"))
    return [
        {
            "run_id": result.run_id,
            "base_stage": result.base,
            "analysis_stage": result.analysis,
            "metric": metric,
            "rank": rank,
            "sample_id": sid,
            "value": value,
            "label": _label(label[pos[sid]]),
            "base_pred": int(bp[pos[sid]]),
            "analysis_pred": int(ap[pos[sid]]),
        }
        for rank, (sid, value) in enumerate(picked, start=1)
    ]


def _label(value) -> int | None:
    """A sample's label; None when the dataset has none (analysis.compare records -1)."""
    return int(value) if value >= 0 else None


def render(all_rows: list[dict]) -> str:
    """debug/badcase.txt: per stage pair, the worst samples."""
    lines = ["# base_stage -> analysis_stage | rank | sample_id | metric=value | label | preds"]
    for r in all_rows:
        lines.append(
            f"{r['base_stage']} -> {r['analysis_stage']} | {r['rank']} | {r['sample_id']} | "
            f"{r['metric']}={r['value']:.6g} | {'-' if r['label'] is None else r['label']} | "
            f"{r['base_pred']} -> {r['analysis_pred']}"
        )
    return "\n".join(lines) + "\n"
