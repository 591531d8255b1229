"""Rerun one stage of an existing run: a new run that reuses everything upstream.

The new run takes the parent's spec (its spec.yaml, the spec as it ran) with ``--set``
overrides, stops after the stage unless ``downstream``, and recomputes that stage even when
the cache holds it; every stage before it is a cache hit by digest (nothing recomputed
unless an override changed its inputs). The new run records its parent, and its analysis
runs again, so its localization can be printed beside the parent's.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from analysis.report import stage_position
from pipelines.flow import ChainResult, StageHook, run_chain
from schemas.spec import load_spec, with_overrides
from schemas.store import RunStore
from schemas.tables import read_run_table
from stages.registry import get, plan

FINDINGS = ("stage", "layer", "triage", "sensitive")
"""The order of the kinds of localization rows side by side."""


def rerun(
    store_root: str | Path,
    run_id: str,
    stage: str,
    overrides: list[str],
    *,
    downstream: bool = False,
    use_prefect: bool = True,
    on_stage: StageHook | None = None,
) -> ChainResult:
    """Rerun ``stage`` of run ``run_id`` (and what follows, with ``downstream``)."""
    name = get(stage.replace("-", "_")).name
    parent = RunStore(store_root).open(run_id)
    spec = load_spec(parent.path("spec.yaml"))
    sets = list(overrides)
    if not downstream:
        sets.append(f"stages.stop_after={name}")
    spec = with_overrides(spec, sets)
    if name not in [s.name for s, _ in plan(spec)]:
        from schemas.errors import SpecError

        raise SpecError(
            f"stage {name} is not part of run {run_id}'s chain",
            where="rerun --stage",
            hint="enable it in the spec (e.g. --set stages.qat.enabled=true)",
        )
    text = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
    return run_chain(
        spec,
        text,
        store_root,
        use_prefect=use_prefect,
        on_stage=on_stage,
        parent=run_id,
        recompute=frozenset({name}),
    )


def localization_side_by_side(store_root: str | Path, parent_id: str, child_id: str) -> list[dict]:
    """The findings of the parent and the rerun side by side: per stage pair its verdict
    and largest own error, then the first divergent layer, triage and sensitive ops."""
    store = RunStore(store_root)
    rows: dict[tuple, dict] = {}
    places: dict[tuple, tuple] = {}
    for side, rid in (("parent", parent_id), ("rerun", child_id)):
        for r in read_run_table(store.open(rid), "localization"):
            key, text = _finding(r)
            rows.setdefault(key, {"kind": r["kind"], "rank": key[1]})[side] = text
            places.setdefault(key, _place(r))
    return [rows[k] for k in sorted(rows, key=places.__getitem__)]


def _place(r: dict) -> tuple[int, int]:
    """Where a finding goes: kinds in FINDINGS order, then stage pairs in chain order and
    the other kinds by rank (a number: rank 10 after rank 2)."""
    kind = FINDINGS.index(r["kind"]) if r["kind"] in FINDINGS else len(FINDINGS)
    return kind, stage_position(r["stage"]) if r["kind"] == "stage" else (r["rank"] or 0)


def _finding(r: dict) -> tuple[tuple, str]:
    """(row key, text) of one localization row."""
    if r["kind"] == "stage":
        verdict = "DIVERGES" if r["rank"] else "ok"
        return ("stage", f"{r['base_stage']}->{r['stage']}"), (
            f"{verdict}, max own error {r['value']:.3g} steps"
        )
    if r["kind"] == "triage":
        return ("triage", r["rank"]), r["detail"]
    return (r["kind"], r["rank"]), f"{r['stage']} {r['layer_id']} ({r['value']:.3g})"
