"""The PTQ chain as a run: its Prefect flow (one task per stage) and its named pipelines."""

from __future__ import annotations

import pytest
import yaml

from pipelines.ptq import PtqStagesSpec, load_ptq_spec, run_ptq
from schemas.errors import SpecError
from schemas.store import RunStore
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
