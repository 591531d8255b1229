"""Runs whose process died: mark them interrupted (every new run does, and ``qparity gc``).

A run killed by SIGKILL, SIGTERM or a power loss never reaches ``finish``: its manifest
says running forever. :func:`mark_interrupted` finds every running run whose owner is gone
(:mod:`schemas.owner`), re-checks it under the manifest lock and writes it interrupted:
the manifest (the run and the stage it was in), that stage's row of the ``stages`` table
and the run's row of the ``runs`` table, so ``qparity runs``, ``show`` and SQL agree.
Stages the run completed keep their artifacts, which the stage cache may reuse.
"""

from __future__ import annotations

import logging

from schemas.errors import QparityError
from schemas.manifest import Manifest
from schemas.owner import bare_run_row, died, interrupted
from schemas.store import Run, RunStore
from schemas.tables import read_run_table, write_rows

LOG = logging.getLogger(__name__)


def mark_interrupted(store: RunStore) -> list[str]:
    """Mark every run whose process is gone interrupted; their ids, oldest first.

    A run that cannot be marked (a damaged manifest or table) is skipped with a warning:
    marking others' runs never stops the caller."""
    marked = []
    for m in store.list_runs():
        if not died(m):
            continue
        try:
            if mark_run(store.open(m.run_id)):
                marked.append(m.run_id)
        except QparityError as e:
            LOG.warning("cannot mark run %s interrupted: %s", m.run_id, e.message)
    return marked


def mark_run(run: Run) -> bool:
    """Mark ``run`` interrupted if its owner is gone (checked again under the manifest
    lock, so a run that just finished is left alone); True if it was marked."""
    marked: list[Manifest] = []

    def apply(m: Manifest) -> Manifest:
        if not died(m):
            return m
        marked.append(interrupted(m))
        return marked[0]

    run.update_manifest(apply)
    if marked:
        _write_rows(run, marked[0])
    return bool(marked)


def _write_rows(run: Run, m: Manifest) -> None:
    """The interrupted stages' rows of ``stages`` and the run's row of ``runs``."""
    for rec in m.stages.values():
        if rec.status == "interrupted":
            row = {
                "run_id": m.run_id, "stage": rec.stage, "status": rec.status,
                "started_at": rec.started_at, "finished_at": rec.finished_at,
                "duration_s": rec.duration_s, "artifact_digest": None,
                "cache_hit": rec.cache_hit,
            }  # fmt: skip
            write_rows(run, "stages", [row], part=rec.stage)
    old = next(iter(read_run_table(run, "runs")), None) or bare_run_row(m)
    write_rows(run, "runs", [{**old, "status": m.status, "finished_at": m.finished_at}], "run")
    run.publish()
