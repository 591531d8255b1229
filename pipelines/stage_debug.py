"""A stage's debug files travel with its artifact, so a run of cache hits has them too.

The files a stage writes to the run's ``debug/`` folder (:meth:`schemas.store.Run.write_debug`:
fx_graph.txt, model_check_result.txt, qat_onnx.txt ...) are copied, as the stage left
them, to ``artifacts/<stage>/debug/<name>``: the artifact owns the copies (``files``, so
they are digest-checked like the rest) and names them (``debug``). A cache hit links the
artifact's files into the new run, then copies each back to ``debug/<name>``, in chain
order, so the new run's debug folder reads as the computing run's did (a file several
stages extend, such as the PTQ chain's model_check_result.txt, ends as the last stage left
it). Copied, not linked: editing a debug file never changes a cached artifact.

The stage's rows of ``tables/faults`` (the faults it applied, whether each changed
anything) travel the same way, as ``artifacts/<stage>/faults.json``: a run whose faulted
stage came from the cache records the faults it carries, under its own run id.
"""

from __future__ import annotations

import json

from schemas.artifacts import Artifact
from schemas.store import Run
from schemas.tables import read_run_table, write_rows


def kept_copy(stage: str, name: str) -> str:
    """Run-relative path of the copy of ``debug/<name>`` that ``stage``'s artifact owns."""
    return f"artifacts/{stage}/debug/{name}"


def keep_debug(run: Run, art: Artifact, names: list[str]) -> Artifact:
    """``art`` owning a copy of each debug file ``names`` (written by its stage)."""
    names = list(dict.fromkeys(names))  # a file written twice is kept once, as last written
    if not names:
        return art
    files = dict(art.files)
    for name in names:
        rel = kept_copy(art.stage, name)
        files[rel] = run.write_file(rel, run.path(f"debug/{name}").read_bytes())
    return art.model_copy(update={"files": files, "debug": names})


def restore_debug(run: Run, art: Artifact) -> None:
    """Copy the debug files ``art`` owns (already in ``run``) back into ``run``'s debug/."""
    for name in art.debug:
        run.write_file(f"debug/{name}", run.path(kept_copy(art.stage, name)).read_bytes())


def kept_faults(stage: str) -> str:
    """Run-relative path of the fault rows that ``stage``'s artifact owns."""
    return f"artifacts/{stage}/faults.json"


def keep_faults(run: Run, art: Artifact) -> Artifact:
    """``art`` owning a copy of the ``tables/faults`` rows its stage wrote (if any)."""
    rows = [
        {k: v for k, v in r.items() if k != "run_id"}
        for r in read_run_table(run, "faults")
        if r["stage"] == art.stage
    ]
    if not rows:
        return art
    rel = kept_faults(art.stage)
    digest = run.write_text(rel, json.dumps(rows, sort_keys=True, indent=1))
    return art.model_copy(update={"files": {**art.files, rel: digest}})


def restore_faults(run: Run, art: Artifact) -> None:
    """Write the fault rows ``art`` owns (already in ``run``) as ``run``'s own."""
    rel = kept_faults(art.stage)
    if rel in art.files:
        rows = json.loads(run.path(rel).read_text())
        write_rows(run, "faults", [{**r, "run_id": run.run_id} for r in rows], art.stage)
