"""The chain without Prefect: cache hits across runs, digests checked, failures recorded."""

import json

import pytest
import yaml

from pipelines.flow import run_chain
from schemas.artifacts import Artifact
from schemas.errors import QparityError
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_table
from tests.conftest import tiny_spec_dict


def _run(root, **sections):
    sections.setdefault("stages", {})
    sections["stages"] = {"stop_after": "pre_export", **sections["stages"]}
    data = tiny_spec_dict(**sections)
    return run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)


def test_second_run_is_all_cache_hits_with_identical_artifacts(tmp_path):
    first = _run(tmp_path)
    second = _run(tmp_path)
    assert list(first.outcomes) == ["prepare", "calibrate", "pre_export"]
    assert not any(o.cache_hit for o in first.outcomes.values())
    assert all(o.cache_hit for o in second.outcomes.values())
    for stage, o in first.outcomes.items():
        assert second.outcomes[stage].artifact.digest == o.artifact.digest
        assert second.outcomes[stage].source_run == first.run_id
    store = RunStore(tmp_path)
    m = store.open(second.run_id).manifest()
    assert m.status == "complete" and all(s.cache_hit for s in m.stages.values())
    calibrated = second.outcomes["calibrate"].artifact
    store.open(second.run_id).load_artifact("calibrate", type(calibrated))  # files verify
    metrics = read_table(tmp_path, "metrics").to_pylist()
    tops = {(r["run_id"], r["stage"]) for r in metrics if r["metric"] == "top1"}
    assert {(second.run_id, s) for s in ("float", "prepare", "calibrate")} <= tops
    hits = {(r["run_id"], r["cache_hit"]) for r in read_table(tmp_path, "stages").to_pylist()}
    assert (second.run_id, True) in hits and (second.run_id, False) not in hits


def test_a_run_of_cache_hits_has_the_debug_files_of_the_run_that_computed_them(tmp_path):
    first = _run(tmp_path, stages={"stop_after": "export"})
    second = _run(tmp_path, stages={"stop_after": "export"})
    assert all(o.cache_hit for o in second.outcomes.values())
    store = RunStore(tmp_path)
    debug = [store.open(r.run_id).path("debug") for r in (first, second)]
    names = ("fx_graph.txt", "model_check_result.txt", "qat_onnx.txt", "lut_tables.txt")
    for name in names:
        assert (debug[1] / name).read_text() == (debug[0] / name).read_text(), name
        assert (debug[1] / name).stat().st_ino != (debug[0] / name).stat().st_ino  # a copy
    export = second.outcomes["export"].artifact
    assert export.debug == ["qat_onnx.txt"]
    assert "artifacts/export/debug/qat_onnx.txt" in export.files  # digest-checked with it


def test_changed_stage_setting_reruns_that_stage_and_what_follows(tmp_path):
    _run(tmp_path, stages={"qat": {"enabled": True, "steps": 1}})
    again = _run(tmp_path, stages={"qat": {"enabled": True, "steps": 2}})
    assert {k: o.cache_hit for k, o in again.outcomes.items()} == {
        "prepare": True,
        "calibrate": True,
        "qat": False,
        "pre_export": False,  # its input changed
    }


def test_tampered_cached_artifact_is_not_reused(tmp_path):
    first = _run(tmp_path)
    state = RunStore(tmp_path).open(first.run_id).path("artifacts/prepare/qat.safetensors")
    state.write_bytes(state.read_bytes()[:-8] + b"tampered")
    again = _run(tmp_path)
    assert not again.outcomes["prepare"].cache_hit
    assert again.outcomes["prepare"].artifact.digest == first.outcomes["prepare"].artifact.digest


def test_failing_stage_marks_the_run_failed_never_complete(tmp_path):
    with pytest.raises(QparityError, match="unsupported op"):
        _run(tmp_path, model={"factory": "tests.models:cumsum"})
    (m,) = RunStore(tmp_path).list_runs()
    assert m.status == "failed" and "unsupported" in m.error
    assert m.stages["prepare"].status == "failed"
    assert read_table(tmp_path, "runs").to_pylist()[0]["status"] == "failed"


def test_failed_stage_has_a_row_in_the_stages_table(tmp_path):
    with pytest.raises(QparityError):
        _run(
            tmp_path,
            data={
                "dataset": "tests.models:nan_data",
                "calibration_samples": 64,
                "evaluation_samples": 64,
                "batch_size": 32,
            },
        )
    (row,) = read_table(tmp_path, "stages").to_pylist()
    assert row["stage"] == "prepare" and row["status"] == "failed"
    assert row["artifact_digest"] is None and row["finished_at"] is not None


def test_analysis_only_computes_nothing_and_fails_on_an_uncached_stage(tmp_path):
    with pytest.raises(QparityError, match="prepare is not in the stage cache") as e:
        _run(tmp_path, pipeline="analysis_only")
    assert "without pipeline: analysis_only" in str(e.value)
    (m,) = RunStore(tmp_path).list_runs()
    assert m.status == "failed" and m.stages["prepare"].status == "failed"
    assert not (RunStore(tmp_path).open(m.run_id).root / "artifacts" / "prepare.json").exists()


def test_analysis_only_reanalyses_a_cached_chain_with_new_compare_settings(tmp_path):
    first = _run(tmp_path, compare={"probe_samples": 2})
    again = _run(tmp_path, pipeline="analysis_only", compare={"probe_samples": 3})
    assert all(o.cache_hit and o.source_run == first.run_id for o in again.outcomes.values())
    assert again.analysis is not None
    probes: dict[str, set[int]] = {}
    for r in read_table(tmp_path, "layer_tensors").to_pylist():
        if r["reason"] == "probe":
            probes.setdefault(r["run_id"], set()).add(r["sample_id"])
    assert (len(probes[first.run_id]), len(probes[again.run_id])) == (2, 3)


def test_the_report_step_writes_the_report_of_the_finished_run(tmp_path):
    result = _run(tmp_path, compare={"probe_samples": 2, "steps": ["report"]})
    run = RunStore(tmp_path).open(result.run_id)
    assert result.steps == {"report": str(run.path("report.html"))}
    html = run.path("report.html").read_text()
    assert result.run_id in html and "complete" in html and "running" not in html


def test_analysis_steps_need_an_analysis_and_known_names(tmp_path):
    result = _run(tmp_path, compare={"enabled": False, "steps": ["report"]})
    assert result.steps == {}
    with pytest.raises(QparityError, match="compare.steps.0") as e:
        _run(tmp_path, compare={"steps": ["sql"]})
    assert "report" in str(e.value)


def test_every_step_a_spec_may_name_has_an_implementation():
    from typing import get_args

    from pipelines.flow import ANALYSIS_STEPS
    from schemas.spec_sections import CompareSpec

    (item,) = get_args(CompareSpec.model_fields["steps"].annotation)
    assert set(get_args(item)) == set(ANALYSIS_STEPS)


def test_a_bad_cache_entry_is_ignored_with_a_warning_and_rewritten(tmp_path, caplog):
    first = _run(tmp_path, stages={"stop_after": "prepare"})
    (entry,) = (tmp_path / ".cache" / "index").glob("*.json")
    entry.write_text('{"x": 1}')
    with caplog.at_level("WARNING", logger="pipelines.runs"):
        again = _run(tmp_path, stages={"stop_after": "prepare"})
    assert not again.outcomes["prepare"].cache_hit
    assert "prepare: ignoring a bad stage cache entry" in caplog.text and entry.name in caplog.text
    assert json.loads(entry.read_text()) == {"run_id": again.run_id, "stage": "prepare"}
    third = _run(tmp_path, stages={"stop_after": "prepare"})
    assert third.outcomes["prepare"].source_run == again.run_id != first.run_id


class _Killed(BaseException):
    """What the crash point raises here instead of SIGKILL (the test goes on)."""


def _killed_at(monkeypatch, n: int):
    """Make the n-th atomic write from now raise _Killed before its rename."""
    from schemas import fileio

    count = [0]

    def crash():
        count[0] += 1
        if count[0] == n:
            raise _Killed

    monkeypatch.setattr(fileio, "_crash_point", crash)


@pytest.mark.parametrize("at", [1, 2, 3, 4])
def test_a_run_killed_while_it_finishes_ends_with_manifest_and_row_agreeing(
    tmp_path, monkeypatch, at
):
    from pipelines import gc
    from pipelines.runs import finish_run, start_run
    from schemas.tables import read_run_table

    spec = parse_spec(tiny_spec_dict(), "t")
    run = start_run(RunStore(tmp_path), spec, yaml.safe_dump(tiny_spec_dict()))
    _killed_at(monkeypatch, at)  # the runs row (pending, part, commit) and the manifest
    with pytest.raises(_Killed):
        finish_run(run, spec)
    monkeypatch.undo()
    monkeypatch.setattr(gc, "died", lambda m: m.status == "running")  # its owner is gone
    gc.mark_run(run)
    (row,) = read_run_table(run, "runs")
    assert row["status"] == run.manifest().status


@pytest.mark.parametrize("entry_is", ["a fifo", "a folder"])
def test_a_cache_entry_that_is_no_file_never_blocks_or_fails_the_stage(tmp_path, caplog, entry_is):
    """A FIFO as the entry blocked every later run of the spec; a folder there made the
    stage fail when its entry was recorded."""
    import os

    from pipelines.runs import run_recorded
    from schemas.fileio import json_digest
    from stages.registry_types import StageCall
    from tests.no_hang import fails_if_blocked
    from tests.schemas.test_store import make_artifact, make_run

    store, run = make_run(tmp_path)
    call = StageCall("prepare", "in", "cfg", "code")
    entry = (
        store.root / ".cache" / "index" / f"{json_digest(['prepare', 'in', 'cfg', 'code'])}.json"
    )
    entry.parent.mkdir(parents=True)
    os.mkfifo(entry) if entry_is == "a fifo" else entry.mkdir()
    with fails_if_blocked(), caplog.at_level("WARNING", logger="pipelines.runs"):
        outcome = run_recorded(store, run, ("prepare", Artifact), lambda: call,
                               lambda c: make_artifact(run))  # fmt: skip
    assert not outcome.cache_hit and run.manifest().stages["prepare"].status == "complete"
    assert entry.name in caplog.text
    if entry_is == "a fifo":  # rewritten: the next run of the stage hits
        assert json.loads(entry.read_text()) == {"run_id": run.run_id, "stage": "prepare"}


def test_an_edited_task_metric_changes_every_stage_key(make_ctx, tmp_path, monkeypatch):
    """Every stage records ``data.metric``; its key held only the metric's name, so an
    edited metric reused the old values from the stage cache."""
    import sys

    from pipelines.runs import _stage_call
    from stages.registry import BY_NAME

    metric = tmp_path / "metric_mod.py"
    metric.write_text("def score(outputs, reference, labels):\n    return {'m': 1.0}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "metric_mod", raising=False)
    data = {**tiny_spec_dict()["data"], "metric": "metric_mod:score"}
    before = _stage_call(make_ctx(data=data), BY_NAME["convert"], None).inputs_digest
    metric.write_text(metric.read_text().replace("1.0", "2.0"))
    after = _stage_call(make_ctx(data=data), BY_NAME["convert"], None).inputs_digest
    assert before != after
