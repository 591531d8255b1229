"""The chain as a Prefect flow, built from the stage registry.

Each stage is a thin Prefect task around :func:`pipelines.runs.execute_stage`; Prefect's
own result cache is off (``NO_CACHE``) because the cache key is ours: the digest of the
input artifacts + stage settings + code version, checked against the files on disk. With
no Prefect server configured, Prefect's ephemeral mode runs the flow in process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

for _k, _v in {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
    "PREFECT_LOGGING_TO_API_ENABLED": "false",
}.items():
    os.environ.setdefault(_k, _v)

from prefect import flow, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from pipelines.prefect_server import prefect_ready  # noqa: E402, F401 (re-export)
from pipelines.runs import StageOutcome, execute_stage, finish_run, start_run  # noqa: E402
from schemas.owner import heartbeat  # noqa: E402
from schemas.spec import PipelineSpec  # noqa: E402
from schemas.store import RunStore  # noqa: E402
from stages import resident  # noqa: E402
from stages.context import RunContext  # noqa: E402
from stages.registry import code_version, plan  # noqa: E402

StageHook = Callable[[str, StageOutcome], None]


@dataclass
class ChainResult:
    """What a chain run gave: the run id, each stage's outcome, the wall time."""

    run_id: str
    outcomes: dict[str, StageOutcome] = field(default_factory=dict)
    wall_s: float = 0.0
    prefect_startup_s: float = 0.0
    analysis: object | None = None
    """The run's :class:`analysis.analyze.Analysis` (None when compare is off or < 2 stages)."""
    steps: dict[str, str] = field(default_factory=dict)
    """What each analysis step of ``compare.steps`` wrote (step -> path)."""


def _report(ctx: RunContext) -> Path:
    from analysis.report import write_report

    return write_report(ctx.run)


ANALYSIS_STEPS: dict[str, Callable[[RunContext], Path]] = {"report": _report}
"""The optional analysis steps a spec may add (``compare.steps``), by name."""


@task(cache_policy=NO_CACHE, persist_result=False)
def stage_task(store: RunStore, ctx: RunContext, stage, upstream) -> StageOutcome:
    """One stage as a Prefect task; publishes its metrics as a Prefect table artifact."""
    outcome = execute_stage(store, ctx, stage, upstream)
    publish_metrics(stage.name, ctx.run.run_id, outcome.artifact)
    return outcome


def publish_metrics(stage: str, run_id: str, artifact) -> None:
    """The artifact's metrics as a Prefect table artifact ``<stage>-metrics`` (if any)."""
    rows = [m.model_dump() for m in getattr(artifact, "metrics", [])]
    if rows:
        create_table_artifact(
            rows,
            key=f"{stage.replace('_', '-')}-metrics",
            description=f"{stage} of run {run_id}",
        )


@task(cache_policy=NO_CACHE, persist_result=False, name="analyze")
def analysis_task(ctx: RunContext):
    """Compare, bad cases, localization; publishes the summary as a markdown artifact."""
    result = run_analysis(ctx)
    publish_localization(ctx.run.run_id, result)
    return result


def publish_localization(run_id: str, analysis) -> None:
    """The analysis summary as a Prefect markdown artifact ``localization`` (if one ran)."""
    if analysis is not None:
        create_markdown_artifact(
            "```\n" + analysis.summary() + "\n```",
            key="localization",
            description=f"localization of run {run_id}",
        )


@task(cache_policy=NO_CACHE, persist_result=False)
def step_task(ctx: RunContext, name: str) -> str:
    """One analysis step of ``compare.steps``; links its output as a markdown artifact."""
    path = str(ANALYSIS_STEPS[name](ctx))
    create_markdown_artifact(f"`{path}`", key=name, description=f"{name} of run {ctx.run.run_id}")
    return path


@flow(name="qparity-chain", validate_parameters=False, persist_result=False)
def chain_flow(
    store: RunStore, ctx: RunContext, on_stage: StageHook | None = None
) -> tuple[dict[str, StageOutcome], object]:
    """Run every planned stage in order, each fed its upstream stage's artifact, then the
    analysis."""
    outcomes = _run_plan(
        store, ctx, on_stage, lambda s, up: stage_task.with_options(name=s.name)(store, ctx, s, up)
    )
    return outcomes, analysis_task(ctx)


@flow(name="qparity-analysis-steps", validate_parameters=False, persist_result=False)
def steps_flow(ctx: RunContext) -> dict[str, str]:
    """The spec's analysis steps of a finished run, one Prefect task each."""
    return {n: step_task.with_options(name=n)(ctx, n) for n in ctx.spec.compare.steps}


def run_steps(ctx: RunContext, analysis, use_prefect: bool) -> dict[str, str]:
    """The spec's analysis steps once the run is finished (so a report shows it complete),
    when an analysis ran: step -> what it wrote. The run is published again after them."""
    if analysis is None or not ctx.spec.compare.steps:
        return {}
    if use_prefect:
        done = with_quiet_prefect(lambda: steps_flow(ctx))
    else:
        done = {name: str(ANALYSIS_STEPS[name](ctx)) for name in ctx.spec.compare.steps}
    ctx.run.publish()
    return done


@task(cache_policy=NO_CACHE, persist_result=False)
def ptq_stage_task(run_one: Callable, stage, upstream, run_id: str):
    """One PTQ stage (``run_one(stage, upstream) -> PtqModel``) as a Prefect task."""
    art = run_one(stage, upstream)
    publish_metrics(stage.name, run_id, art)
    return art


@flow(name="qparity-ptq-chain", validate_parameters=False, persist_result=False)
def ptq_flow(run_one: Callable, stages, run_id: str):
    """The PTQ chain (``stages`` in order, each fed the one before) as a Prefect flow."""
    upstream = None
    for stage in stages:
        upstream = ptq_stage_task.with_options(name=stage.name)(run_one, stage, upstream, run_id)
    return upstream


def run_analysis(ctx: RunContext):
    """The run's analysis, or None when the spec turns it off or < 2 stages ran."""
    from analysis.analyze import analyze, comparable_stages
    from schemas.errors import QueryError

    if not ctx.spec.compare.enabled:
        return None
    try:
        comparable_stages(ctx)
    except QueryError:
        return None
    return analyze(ctx)


def _run_plan(store, ctx, on_stage, run_one) -> dict[str, StageOutcome]:
    outcomes: dict[str, StageOutcome] = {}
    for stage, up in plan(ctx.spec):
        upstream = outcomes[up.name].artifact if up else None
        outcomes[stage.name] = run_one(stage, upstream)
        if on_stage:
            on_stage(stage.name, outcomes[stage.name])
    return outcomes


def run_chain(
    spec: PipelineSpec,
    spec_text: str,
    store_root: str | Path,
    *,
    use_prefect: bool = True,
    on_stage: StageHook | None = None,
    parent: str | None = None,
    recompute: frozenset[str] = frozenset(),
) -> ChainResult:
    """Create a run for ``spec`` and execute its chain; the run is marked failed on error.

    ``recompute`` names stages computed even when the cache holds them; ``parent`` is the
    run this one was derived from (``qparity rerun``)."""
    resident.tune_malloc()  # before Prefect's and the comparison's threads start
    startup = prefect_ready() if use_prefect else 0.0
    store = RunStore(store_root)
    run = start_run(store, spec, spec_text, parent)
    ctx = RunContext(spec=spec, run=run, code_version=code_version(), recompute=recompute)
    result, t0 = ChainResult(run.run_id, prefect_startup_s=startup), time.perf_counter()
    try:
        with heartbeat(run.heartbeat):  # a killed run is told from a slow one (schemas.owner)
            if use_prefect:
                result.outcomes, result.analysis = with_quiet_prefect(
                    lambda: chain_flow(store, ctx, on_stage)
                )
            else:
                result.outcomes = _run_plan(
                    store, ctx, on_stage, lambda s, up: execute_stage(store, ctx, s, up)
                )
                result.analysis = run_analysis(ctx)
    except BaseException as e:
        finish_run(run, spec, error=f"{type(e).__name__}: {e}")
        raise
    finish_run(run, spec)
    result.steps = run_steps(ctx, result.analysis, use_prefect)
    result.wall_s = time.perf_counter() - t0
    return result


def with_quiet_prefect(fn):
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        return fn()
