"""Sweeps: expansion, validation, a 4-run sweep in process and on a 2-worker Dask cluster.

Both sweeps run against a Prefect server this module starts itself (127.0.0.1, a free port,
a temporary PREFECT_HOME) and share one run store: the in-process sweep computes the stages,
the Dask sweep's workers then find them in the cache (only the analysis is recomputed).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pipelines.sweep import expand, load_sweep, run_sweep
from schemas.errors import SpecError
from schemas.store import RunStore
from tests.conftest import tiny_spec_dict

SWEEP = {
    "name": "tiny-sweep",
    "spec": "tiny.yaml",
    "matrix": {"quant.consistency_level": ["none", 2]},
    "include": [
        {"quant.observer": "percentile"},
        {"stages.board_sim.runtime_format": "rgb"},  # valid spec; board_sim refuses it
    ],
}


def write_sweep(folder: Path, sweep: dict, name: str = "sweep.yaml") -> Path:
    """The tiny spec as tiny.yaml beside the sweep file; returns the sweep file's path."""
    (folder / "tiny.yaml").write_text(yaml.safe_dump(tiny_spec_dict()))
    path = folder / name
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def test_expansion_is_the_product_then_include(tmp_path):
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(tiny_spec_dict(name="other")))
    sweep = {
        "name": "golden",
        "matrix": {"spec": ["tiny.yaml", "other.yaml"], "quant.march": ["nash-e", "nash-m"]},
        "set": {"compare.probe_samples": 1},
        "include": [{"spec": "tiny.yaml", "quant.rounding": "bpu_round"}],
    }
    runs = expand(load_sweep(write_sweep(tmp_path, sweep)), "golden-1")
    got = [(lab, s.name, s.quant.march, s.quant.rounding, s.compare.probe_samples, s.tags) for lab, s in runs]  # fmt: skip
    tag = {"sweep": "golden-1"}
    assert got == [
        ("spec=tiny,march=nash-e", "tiny", "nash-e", "half_even", 1,
         {**tag, "spec": "tiny", "quant.march": "nash-e"}),
        ("spec=tiny,march=nash-m", "tiny", "nash-m", "half_even", 1,
         {**tag, "spec": "tiny", "quant.march": "nash-m"}),
        ("spec=other,march=nash-e", "other", "nash-e", "half_even", 1,
         {**tag, "spec": "other", "quant.march": "nash-e"}),
        ("spec=other,march=nash-m", "other", "nash-m", "half_even", 1,
         {**tag, "spec": "other", "quant.march": "nash-m"}),
        ("spec=tiny,rounding=bpu_round", "tiny", "nash-e", "bpu_round", 1,
         {**tag, "spec": "tiny", "quant.rounding": "bpu_round"}),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red"}, "colour: unknown key"),
        ({"matrix": {}}, "matrix: the matrix is empty"),
        ({"matrix": {"quant.levels": [1]}}, "run levels=1: quant.levels: unknown key"),
        ({"matrix": {"quant.consistency_level": [3]}}, "quant.consistency_level: input should be"),
        ({"runner": {"kind": "dask"}}, "runner: give exactly one of address"),
        ({"spec": None}, "give the spec file either as spec or as matrix.spec"),
        (
            {"matrix": {"quant.march": ["nash-e", "nash-e"]}},
            "same combination (quant.march=nash-e)",
        ),
    ],
)
def test_a_bad_sweep_file_is_a_spec_error_naming_file_and_field(tmp_path, change, message):
    path = write_sweep(tmp_path, {**SWEEP, **change})
    with pytest.raises(SpecError, match="sweep.yaml") as e:
        load_sweep(path)
    assert message in e.value.message


@functools.cache
def _server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PREFECT_HOME": tempfile.mkdtemp(prefix="prefect-home-"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    for _ in range(360):
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.25)
    _stop(proc)
    raise RuntimeError("prefect server did not start in 90 s")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def prefect_api(request):
    """PREFECT_API_URL of a server started for this test session (stopped at its end)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    proc, url = _server()
    request.config.add_cleanup(lambda: _stop(proc) if proc.poll() is None else None)
    with temporary_settings({PREFECT_API_URL: url}):
        yield url


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("sweep-runs")


def _check(result, store: Path) -> None:
    """3 runs complete, the rgb one failed at board_sim and is named; tags in the store."""
    by_label = {r.label: r for r in result.runs}
    assert list(by_label) == [
        "consistency_level=none", "consistency_level=2", "observer=percentile",
        "runtime_format=rgb",
    ]  # fmt: skip
    bad = by_label.pop("runtime_format=rgb")
    assert bad.status == "failed" and "featuremap-trained model" in bad.error
    assert bad.run_id and RunStore(store).open(bad.run_id).manifest().status == "failed"
    for r in by_label.values():
        assert r.status == "complete" and r.last_stage == "board_sim" and 0 <= r.value <= 1
        assert r.metric == "top1"  # the sweep's dataset has labels
        m = RunStore(store).open(r.run_id).manifest()
        assert m.tags["sweep"] == result.sweep_id and m.status == "complete"


def _flow_run_state(sweep_id: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[sweep_id]))
        )
    return runs[0].state.name if len(runs) == 1 else f"{len(runs)} flow runs"


def _tasks_and_artifacts(sweep_id: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The sweep's flow run read back from the API: task run name -> its tags, and task
    run name -> the keys of its artifacts (the flow's own under "flow")."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterName,
    )

    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[sweep_id]))
        )
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    names = {t.id: t.name for t in tasks}
    keys: dict[str, set[str]] = {}
    for a in artifacts:
        keys.setdefault(names.get(a.task_run_id, "flow"), set()).add(a.key)
    return {t.name: set(t.tags) for t in tasks}, keys


def test_a_sweep_runs_in_process_and_one_failing_run_does_not_stop_it(prefect_api, store):
    ended = []
    result = run_sweep(write_sweep(store.parent, SWEEP, "local.yaml"), store, on_run=ended.append)
    print(result.table())
    _check(result, store)
    assert len({r.where for r in result.runs}) == 1  # all in this process
    assert _flow_run_state(result.sweep_id) == "Completed"
    assert sorted(ended, key=result.runs.index) == result.runs  # each run reported as it ended
    tags, artifacts = _tasks_and_artifacts(result.sweep_id)
    sweep = f"sweep={result.sweep_id}"
    assert tags == {
        "consistency_level=none": {sweep, "quant.consistency_level=none"},
        "consistency_level=2": {sweep, "quant.consistency_level=2"},
        "observer=percentile": {sweep, "quant.observer=percentile"},
        "runtime_format=rgb": {sweep, "stages.board_sim.runtime_format=rgb"},
    }
    assert artifacts.pop("flow") == {"sweep-summary"}
    failed = artifacts.pop("runtime_format=rgb")  # compile refused it: the stages before
    assert {"prepare-metrics", "calibrate-metrics", "convert-metrics"} <= failed
    assert not failed & {"compile-metrics", "board-sim-metrics", "localization"}
    assert set(artifacts) == {
        "consistency_level=none",
        "consistency_level=2",
        "observer=percentile",
    }
    for keys in artifacts.values():
        assert {"prepare-metrics", "board-sim-metrics", "localization"} <= keys


def test_a_sweep_runs_on_a_two_worker_dask_cluster(prefect_api, store):
    sweep = {**SWEEP, "name": "tiny-dask", "runner": {"kind": "dask", "workers": 2}}
    t0 = time.perf_counter()
    result = run_sweep(write_sweep(store.parent, sweep, "dask.yaml"), store)
    print(result.table(), f"dask sweep {time.perf_counter() - t0:.1f} s")
    _check(result, store)
    pids = {r.where.rsplit(":", 1)[1] for r in result.runs}
    assert str(os.getpid()) not in pids and 1 <= len(pids) <= 2  # on the workers
    assert _flow_run_state(result.sweep_id) == "Completed"
    tags, artifacts = _tasks_and_artifacts(result.sweep_id)  # tasks ran on the workers
    assert tags["consistency_level=2"] == {f"sweep={result.sweep_id}", "quant.consistency_level=2"}
    assert {"prepare-metrics", "board-sim-metrics", "localization"} <= artifacts[
        "observer=percentile"
    ]


def test_a_run_without_labels_is_summarized_by_its_primary_metric():
    from types import SimpleNamespace

    from pipelines.sweep_flow import _last_primary
    from schemas.artifacts import Metric
    from schemas.spec import parse_spec

    spec = parse_spec(tiny_spec_dict(), "t")
    rows = [Metric(stage="board_sim", metric=k, value=v, n_samples=64, output="output")
            for k, v in (("cosine", 0.999), ("l1", 0.01))]  # fmt: skip
    outcomes = {"board_sim": SimpleNamespace(artifact=SimpleNamespace(metrics=rows))}
    assert _last_primary(spec, outcomes) == ("board_sim", ("cosine", 0.999))
    labelled = [*rows, Metric(stage="board_sim", metric="top1", value=0.9, n_samples=64)]
    outcomes["board_sim"].artifact.metrics = labelled
    assert _last_primary(spec, outcomes) == ("board_sim", ("top1", 0.9))
    from pipelines.sweep import RunRecord

    record = RunRecord("a", "r-1", "complete", 0.999, "board_sim", None, 1.0, metric="cosine")
    assert "cosine 0.9990 (board_sim)" in record.line()


def test_a_failed_run_publishes_the_metrics_of_the_stages_it_completed(make_ctx, monkeypatch):
    """A run failing at board_sim still shows prepare's (with the float model's rows) and
    convert's metrics in its task's artifacts, read from its metrics table."""
    import pipelines.sweep_flow as sf
    from schemas.tables import write_rows

    run = make_ctx().run
    rows = [{"run_id": run.run_id, "stage": s, "metric": "top1", "value": v, "n_samples": 64,
             "output": "output"} for s, v in (("float", 0.99), ("prepare", 0.99), ("convert", 0.9))]  # fmt: skip
    write_rows(run, "metrics", rows, "all")
    published: dict[str, list] = {}
    monkeypatch.setattr(sf, "create_table_artifact", lambda t, key, description: published.update({key: t}))  # fmt: skip
    sf.publish_stored(str(run.root.parent), run.run_id)
    assert sorted(published) == ["convert-metrics", "prepare-metrics"]
    assert [r["stage"] for r in published["prepare-metrics"]] == ["float", "prepare"]
    assert published["convert-metrics"][0]["value"] == 0.9
    sf.publish_stored(str(run.root.parent), "no-such-run-20260101T000000-000000")  # nothing
    assert len(published) == 2
