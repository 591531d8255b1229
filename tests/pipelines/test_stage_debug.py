"""What travels with a stage's artifact (pipelines/stage_debug.py): its debug files and
its fault rows, restored into a run that takes the stage from the cache."""

from __future__ import annotations

from typing import Literal

from pipelines.runs import run_recorded
from schemas.artifacts import Artifact
from schemas.store import RunStore
from schemas.tables import read_run_table, write_rows
from stages.registry_types import StageCall

H = "0" * 64


class Faulted(Artifact):
    """A stand-in artifact of a stage that applies faults."""

    kind: Literal["faulted"] = "faulted"


def _fault(run_id: str, amount: float, changed: bool) -> dict:
    return {"run_id": run_id, "stage": "calibrate", "layer_id": "conv", "op_type": "conv",
            "kind": "calib_scale", "amount": amount, "detail": "{}", "changed": changed,
            "reason": "output scale 0.01 -> 0.005" if changed else "the factor rounds away"}  # fmt: skip


def _calibrate(store: RunStore):
    """A new run whose calibrate stage applies two faults (or takes them from the cache)."""
    run = store.create_run("t", "", H, "test", {}, {})

    def compute(call: StageCall) -> Artifact:
        write_rows(run, "faults", [_fault(run.run_id, -4, True), _fault(run.run_id, 1e-9, False)],
                   "calibrate")  # fmt: skip
        run.write_text("artifacts/calibrate/state.txt", "scales")
        return call.make(Faulted, run, ["artifacts/calibrate/state.txt"])

    call = StageCall("calibrate", H, H, "test")
    return run, run_recorded(store, run, ("calibrate", Faulted), lambda: call, compute)


def test_a_run_whose_faulted_stage_is_a_cache_hit_records_its_faults(tmp_path):
    """Fault rows are written while the stage computes: a run taking it from the cache had
    none, so show and the summary said nothing of the faults it carries."""
    store = RunStore(tmp_path)
    (first, computed), (second, hit) = _calibrate(store), _calibrate(store)
    assert not computed.cache_hit and hit.cache_hit
    rows = [read_run_table(r, "faults") for r in (first, second)]
    assert [r["run_id"] for r in rows[1]] == [second.run_id] * 2
    assert [{**r, "run_id": ""} for r in rows[1]] == [{**r, "run_id": ""} for r in rows[0]]
    assert "artifacts/calibrate/faults.json" in hit.artifact.files  # digest-checked with it


def test_a_stage_without_faults_keeps_no_fault_file(tmp_path):
    store = RunStore(tmp_path)
    run = store.create_run("t", "", H, "test", {}, {})

    def compute(call: StageCall) -> Artifact:
        run.write_text("artifacts/prepare/x.txt", "x")
        return call.make(Faulted, run, ["artifacts/prepare/x.txt"])

    call = StageCall("prepare", H, H, "test")
    out = run_recorded(store, run, ("prepare", Faulted), lambda: call, compute)
    assert list(out.artifact.files) == ["artifacts/prepare/x.txt"]
