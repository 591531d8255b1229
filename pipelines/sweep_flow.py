"""The sweep as a Prefect flow: one task per run, on local threads or on a Dask cluster.

Why one *task* per run and not a subflow: prefect-dask's DaskTaskRunner ships tasks to the
workers, while a subflow called inside a flow runs in the calling process, so subflows would
never leave this machine. Each task runs a whole chain with ``run_chain(use_prefect=False)``:
its stages are plain calls inside the task (content-addressed cache, manifest and tables as
usual), and the UI shows one task per run with its state and duration, tagged like the run
(``sweep=<id>`` and its matrix values), the run's artifacts (``<stage>-metrics`` tables, the
``localization`` summary) and a table artifact ``sweep-summary`` for the whole sweep.

Dask workers write into the same run store as this process, so the store must be a path
every worker sees (a local folder for a LocalCluster; a shared mount for remote workers).
They report task states to the Prefect API named by their own ``PREFECT_API_URL``; for a
LocalCluster it is exported to the workers (the configured server, else this process's
temporary one; docs/environment.md, "Prefect": each worker starting its own costs ~20 s).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

# isort: off
from pipelines.flow import (  # first: it sets the quiet Prefect defaults
    prefect_ready,
    publish_localization,
    publish_metrics,
    run_chain,
)
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

# isort: on
from analysis.primary import read_primary
from pipelines.sweep import DaskRunner, LocalRunner, RunRecord
from schemas.errors import QparityError
from schemas.spec import PipelineSpec
from schemas.store import RunStore
from schemas.tables import read_run_table

OnRun = Callable[[RunRecord], None]
"""Called with each run's record as soon as the run ends (the CLI's progress lines)."""


def execute_run(
    label: str, spec: PipelineSpec, store_root: str, publish: bool = False
) -> RunRecord:
    """Run one chain; any error becomes a failed record (one bad run must not stop a sweep).

    ``publish``: inside a Prefect task, publish the run's stage metrics and localization as
    artifacts of that task (as the chain flow's tasks do); a failed run's, the metrics of
    the stages it completed (:func:`publish_stored`)."""
    t0 = time.perf_counter()
    try:
        result = run_chain(spec, "", store_root, use_prefect=False)
        if publish:
            _publish(result)
    except Exception as e:  # QparityError and anything unexpected alike: record, go on
        error = e.message if isinstance(e, QparityError) else f"{type(e).__name__}: {e}"
        run_id = _run_with_tags(store_root, dict(spec.tags))
        if publish and run_id:
            publish_stored(store_root, run_id)
        wall = time.perf_counter() - t0
        return RunRecord(label, run_id, "failed", None, None, None, wall, error, _where())
    last, (metric, value) = _last_primary(spec, result.outcomes)
    first = getattr(result.analysis, "first", None)
    return RunRecord(
        label,
        result.run_id,
        "complete",
        value,
        last,
        first.analysis if first is not None else None,
        time.perf_counter() - t0,
        where=_where(),
        metric=metric,
    )


def _publish(result) -> None:
    """The run's ``<stage>-metrics`` tables and ``localization`` markdown as artifacts."""
    for stage, outcome in result.outcomes.items():
        publish_metrics(stage, result.run_id, outcome.artifact)
    publish_localization(result.run_id, result.analysis)


def publish_stored(store_root: str, run_id: str) -> None:
    """A failed run's ``<stage>-metrics`` artifacts, one per stage it completed, read from
    its metrics table (the float model's rows go with prepare's, as prepare measures
    them): the stages before the failure are what a nightly failure is read by."""
    try:
        rows = read_run_table(RunStore(store_root).open(run_id), "metrics")
    except QparityError:  # nothing readable to publish; the record says why the run failed
        return
    by_stage: dict[str, list[dict]] = {}
    for r in rows:
        stage = "prepare" if r["stage"] == "float" else r["stage"]
        by_stage.setdefault(stage, []).append({k: v for k, v in r.items() if k != "run_id"})
    for stage, stage_rows in by_stage.items():
        create_table_artifact(
            stage_rows,
            key=f"{stage.replace('_', '-')}-metrics",
            description=f"{stage} of run {run_id} (the run failed later)",
        )


def run_tags(spec: PipelineSpec) -> list[str]:
    """The Prefect tags of a run's task: its run tags as ``key=value`` (``sweep=<id>``, the
    run's matrix values, and the spec's own tags)."""
    return [f"{k}={v}" for k, v in spec.tags.items()]


def _where() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _last_primary(spec, outcomes: dict) -> tuple[str | None, tuple[str, float | None]]:
    """(last stage, (primary metric, its value there)) from the stage outcomes."""
    if not outcomes:
        return None, ("top1", None)
    stage, outcome = list(outcomes.items())[-1]
    rows = [m.model_dump() for m in getattr(outcome.artifact, "metrics", [])]
    primary = read_primary(spec, [r for r in rows if r["stage"] == stage])
    return stage, (primary.name, primary.values.get(stage))


def _run_with_tags(root: str | Path, tags: dict[str, str]) -> str | None:
    """The id of the run carrying exactly ``tags`` (unique within a sweep), if it was made.

    run_chain raises without the id of the run it created; the sweep tags find it."""
    try:
        hits = [m.run_id for m in RunStore(root).list_runs() if m.tags == tags]
    except QparityError:
        return None
    return hits[-1] if hits else None


@task(name="sweep-run", cache_policy=NO_CACHE, persist_result=False)
def run_task(label: str, spec: PipelineSpec, store_root: str) -> RunRecord:
    """One run of a sweep as a Prefect task, publishing the run's artifacts."""
    return execute_run(label, spec, store_root, publish=True)


@flow(name="qparity-sweep", validate_parameters=False, persist_result=False)
def sweep_flow(
    runs: list[tuple[str, PipelineSpec]], store_root: str, on_run: OnRun | None = None
) -> list[RunRecord]:
    """Submit one task per run (tagged like the run) to the flow's task runner; collect a
    record per run, in the sweep's order, calling ``on_run`` as each run ends."""
    futures = {
        label: run_task.with_options(task_run_name=label, tags=run_tags(spec)).submit(
            label, spec, store_root
        )
        for label, spec in runs
    }
    labels = {fut.task_run_id: label for label, fut in futures.items()}
    done: dict[str, RunRecord] = {}
    for fut in as_completed(list(futures.values())):
        label = labels[fut.task_run_id]
        try:
            done[label] = fut.result()
        except Exception as e:  # a lost worker: the task itself never raises
            done[label] = RunRecord(label, None, "failed", None, None, None, 0.0, repr(e))
        if on_run:
            on_run(done[label])
    records = [done[label] for label in futures]
    create_table_artifact(
        [{k: v for k, v in asdict(r).items()} for r in records],
        key="sweep-summary",
        description="one row per run of the sweep",
    )
    return records


def task_runner(runner: LocalRunner | DaskRunner):
    """The Prefect task runner a sweep file's ``runner`` asks for."""
    from prefect.task_runners import ThreadPoolTaskRunner

    if isinstance(runner, LocalRunner):
        return ThreadPoolTaskRunner(max_workers=1)  # torch stages share one process: serial
    from prefect_dask import DaskTaskRunner

    logging.getLogger("distributed").setLevel(logging.WARNING)  # its INFO lines drown the table
    if runner.address:
        return DaskTaskRunner(address=runner.address)
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": runner.workers,
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            "dashboard_address": None,
            "silence_logs": logging.WARNING,  # the cluster's INFO lines drown the summary
        },
    )


def run_flow(
    runs: list[tuple[str, PipelineSpec]],
    root: str | Path,
    sweep_id: str,
    runner,
    on_run: OnRun | None = None,
) -> list[RunRecord]:
    """Run the sweep flow (flow run named by the sweep id) on ``runner``."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    prefect_ready()
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), _worker_env(runner):
        configured = sweep_flow.with_options(
            task_runner=task_runner(runner), flow_run_name=sweep_id
        )
        return configured(runs, str(root), on_run)


@contextmanager
def _worker_env(runner) -> Iterator[None]:
    """PREFECT_API_URL in os.environ while a LocalCluster starts, so its workers report to
    this process's server instead of each starting a temporary one."""
    if not (isinstance(runner, DaskRunner) and runner.workers):
        yield
        return
    old, log = os.environ.get("PREFECT_API_URL"), logging.getLogger("distributed")
    os.environ["PREFECT_API_URL"], level = _api_url(), log.level
    log.setLevel(logging.WARNING)  # the scheduler's INFO lines would drown the summary
    try:
        yield
    finally:
        log.setLevel(level)
        if old is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = old


def _api_url() -> str:
    """The configured API URL, else the URL of this process's temporary server."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return PREFECT_API_URL.value()
    from prefect.server.api.server import SubprocessASGIServer

    return SubprocessASGIServer().api_url
