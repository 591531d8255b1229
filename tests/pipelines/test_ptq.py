"""The PTQ chain as a run: its Prefect flow (one task per stage) and its named pipelines."""

from __future__ import annotations

import pytest
import yaml

from pipelines.ptq import PtqSpec, PtqStagesSpec, load_ptq_spec, run_ptq
from schemas.errors import SpecError, StageError
from schemas.store import RunStore
from schemas.tables import read_run_table
from stages.ptq.chain import STAGES
from tests.stages.ptq.conftest import export_tiny, spec


def _flow_task_names(run_id: str) -> list[str]:
    """Task-run names of the newest 'qparity-ptq-chain' flow run, in start order."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["qparity-ptq-chain"])),
            sort=FlowRunSort.START_TIME_DESC, limit=1,
        )  # fmt: skip
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    assert flow_run.state.is_completed()
    return [t.name for t in sorted(tasks, key=lambda t: t.start_time)]


def test_the_ptq_chain_runs_as_a_prefect_flow_with_one_task_per_stage(tmp_path):
    onnx_path = export_tiny(tmp_path / "tiny.onnx")
    cfg = spec().model_copy(update={"stages": PtqStagesSpec(stop_after="calibrated")})
    run_id = run_ptq(onnx_path, cfg, tmp_path / "runs", use_prefect=True)
    m = RunStore(tmp_path / "runs").open(run_id).manifest()
    order = sorted(m.stages, key=lambda name: m.stages[name].started_at)
    assert order == ["original", "optimized", "calibrated"] and m.status == "complete"
    names = _flow_task_names(run_id)
    assert [n.split("-")[0] for n in names] == ["original", "optimized", "calibrated"]


def _ptq_spec_file(tmp_path, **top) -> str:
    data = {
        "model": {"file": "unused.onnx"},
        "data": {"dataset": "tests.models:data"},
        **top,
    }
    path = tmp_path / "ptq.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_named_ptq_pipelines_set_where_the_chain_stops(tmp_path):
    cfg, _ = load_ptq_spec(_ptq_spec_file(tmp_path, pipeline="ptq_to_quantized"))
    assert cfg.stages.stop_after == "quantized"
    cfg, _ = load_ptq_spec(_ptq_spec_file(tmp_path, pipeline="ptq_chain"))
    assert cfg.stages.stop_after is None


def test_bad_ptq_pipeline_and_stage_names_are_clear_errors(tmp_path):
    with pytest.raises(SpecError, match="unknown named pipeline 'qat_chain'") as e:
        load_ptq_spec(_ptq_spec_file(tmp_path, pipeline="qat_chain"))
    assert "ptq_to_quantized" in str(e.value) and "named/ptq" in str(e.value)
    with pytest.raises(SpecError, match="unknown PTQ stage 'convert'"):
        load_ptq_spec(_ptq_spec_file(tmp_path, stages={"stop_after": "convert"}))
    with pytest.raises(SpecError, match="unknown PTQ stage 'nope'"):
        run_ptq(tmp_path / "x.onnx", spec(), tmp_path / "runs", stop_after="nope")
    assert RunStore(tmp_path / "runs").list_runs() == []  # refused before a run was made


TASK = "tests.stages.test_evaluate:miou"  # {"miou": arg-max agreement, "seen": frames}


def _with_metric(metric: str | None = TASK, primary: str | None = "miou"):
    base = spec().model_dump(mode="json")
    base["data"]["metric"], base["compare"]["primary"] = metric, primary
    return PtqSpec.model_validate(base)


@pytest.fixture(scope="module")
def task_run(tmp_path_factory):
    """The tiny model through the whole chain with data.metric and compare.primary: miou."""
    tmp = tmp_path_factory.mktemp("task")
    run_id = run_ptq(export_tiny(tmp / "tiny.onnx"), _with_metric(), tmp / "runs")
    return RunStore(tmp / "runs").open(run_id)


def test_every_ptq_stage_records_the_task_metric(task_run):
    rows = read_run_table(task_run, "metrics")
    miou = {r["stage"]: r for r in rows if r["metric"] == "miou"}
    assert set(miou) == {s.name for s in STAGES}
    assert miou["original"]["value"] == 1.0 and miou["original"]["output"] is None
    assert {r["stage"] for r in rows if r["metric"] == "seen"} == set(miou)


def test_localize_judges_a_ptq_run_by_the_task_metric(task_run):
    from analysis.ptq_analysis import analyze_ptq

    analysis = analyze_ptq(task_run, _with_metric())
    assert analysis.judged == "miou of output"


def test_ptq_compare_primary_must_be_a_recorded_metric(tmp_path):
    with pytest.raises(SpecError, match="compare.primary: 'miou' is not a metric") as e:
        load_ptq_spec(_ptq_spec_file(tmp_path, compare={"primary": "miou"}))
    assert "data.metric" in e.value.hint
    ok = {"data": {"dataset": "tests.models:data", "metric": TASK}, "compare": {"primary": "miou"}}
    cfg, _ = load_ptq_spec(_ptq_spec_file(tmp_path, **ok))
    assert (cfg.data.metric, cfg.judging().primary) == (TASK, "miou")


@pytest.mark.parametrize(
    ("metric", "error", "says"),
    [("tests.stages.test_evaluate:no_such", SpecError, "has no 'no_such'"),
     ("tests.pipelines.test_ptq:_raising", StageError, "raised ZeroDivisionError"),
     ("tests.pipelines.test_ptq:_not_floats", StageError, "returned {'miou': 'high'}")],
)  # fmt: skip
def test_a_bad_ptq_task_metric_stops_original_naming_the_field(tmp_path, metric, error, says):
    onnx_path = export_tiny(tmp_path / "tiny.onnx")
    cfg = _with_metric(metric, None).model_copy(
        update={"stages": PtqStagesSpec(stop_after="original")}
    )
    with pytest.raises(error) as e:
        run_ptq(onnx_path, cfg, tmp_path / "runs")
    assert e.value.where == "data.metric" and says in e.value.what


def _raising(out, ref, labels):
    return {"miou": 1 / 0}


def _not_floats(out, ref, labels):
    return {"miou": "high"}


def test_a_task_metric_added_to_a_spec_is_not_served_from_the_cache(tmp_path):
    onnx_path, stop = export_tiny(tmp_path / "tiny.onnx"), PtqStagesSpec(stop_after="calibrated")
    run_ptq(onnx_path, spec().model_copy(update={"stages": stop}), tmp_path / "runs")
    cfg = _with_metric().model_copy(update={"stages": stop})
    run = RunStore(tmp_path / "runs").open(run_ptq(onnx_path, cfg, tmp_path / "runs"))
    assert {r["stage"] for r in read_run_table(run, "metrics") if r["metric"] == "miou"} == {
        "original", "optimized", "calibrated"}  # fmt: skip
    assert not any(s.cache_hit for s in run.manifest().stages.values())
