"""Creating runs, executing one stage with the content-addressed cache, and run tables.

Cache key of a stage = digest(stage name, inputs digest, config digest, code version), where
the inputs digest combines the upstream artifact's digest and the digests of the data the
stage reads. A hit is taken only if the cached artifact's files still verify; its files are
linked (or copied) into the new run, and its stage's debug files copied back into the run's
debug/ folder (:mod:`pipelines.stage_debug`), so every run folder is complete on its own.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from pipelines.gc import mark_interrupted
from pipelines.limits import guard
from pipelines.stage_debug import keep_debug, keep_faults, restore_debug, restore_faults
from schemas.artifacts import Artifact, combined_digest
from schemas.errors import ArtifactError, SpecError, StageError
from schemas.fileio import json_digest, utc_now
from schemas.manifest import Manifest
from schemas.remote import default_store_root, is_url  # noqa: F401 (re-export)
from schemas.spec import PipelineSpec, spec_digest, stage_config_digest
from schemas.store import Run, RunStore
from schemas.tables import write_rows
from stages import resident
from stages.context import RunContext, toolchain_settings
from stages.registry import StageDef, code_version
from stages.registry_types import StageCall

LOG = logging.getLogger(__name__)
PACKAGES = ("torch", "torchao", "numpy", "onnx", "onnxruntime", "prefect", "pydantic")


def versions() -> dict[str, str]:
    """Versions of python and the libraries whose behaviour the numbers depend on."""
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "missing"
    return out


def start_run(
    store: RunStore, spec: PipelineSpec, spec_text: str, parent: str | None = None
) -> Run:
    """A new run folder for ``spec`` (status running, its row in the runs table), after
    marking runs whose process died interrupted (:mod:`pipelines.gc`).

    Its spec.yaml is ``spec_text`` when that is the spec as run, else (overrides, injected
    faults) the effective spec, so analysing the run later sees what ran."""
    mark_interrupted(store)
    run = store.create_run(
        spec.name,
        effective_spec_text(spec, spec_text),
        spec_digest(spec),
        code_version(),
        versions(),
        dict(spec.tags),
        parent_run=parent,
        judging=spec.compare.as_judging(),
    )
    write_run_row(run, run.manifest(), spec)
    return run


def effective_spec_text(spec: PipelineSpec, spec_text: str) -> str:
    """``spec_text`` if it parses to ``spec``, else ``spec`` dumped as YAML."""
    import yaml

    from schemas.spec import parse_spec

    try:
        same = spec_digest(parse_spec(yaml.safe_load(spec_text), "spec")) == spec_digest(spec)
    except (SpecError, yaml.YAMLError):  # unparsable text: the dump is the truth
        same = False
    if same:
        return spec_text
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


@dataclass(frozen=True)
class StageOutcome:
    """What executing one stage gave: its artifact, whether it was cached, how long."""

    artifact: Artifact
    cache_hit: bool
    duration_s: float
    source_run: str | None = None


def execute_stage(
    store: RunStore, ctx: RunContext, stage: StageDef, upstream: Artifact | None
) -> StageOutcome:
    """Run one stage (or take it from the cache), record it in the manifest and tables."""
    lim = ctx.spec.limits

    def compute(call: StageCall) -> Artifact:
        if ctx.spec.stages.cached_only:
            raise StageError(
                f"stage {stage.name} is not in the stage cache and stages.cached_only is set",
                where=f"stage {stage.name}",
                hint="run the chain once without pipeline: analysis_only "
                "(stages.cached_only: false), then analyse again",
            )
        with guard(stage.name, lim.stage_seconds, lim.stage_memory_mb):
            return stage.fn(upstream, ctx, call)

    return run_recorded(
        store,
        ctx.run,
        (stage.name, stage.output),
        lambda: _stage_call(ctx, stage, upstream),
        compute,
        use_cache=stage.name not in ctx.recompute,
    )


def run_recorded(
    store: RunStore,
    run: Run,
    stage: tuple[str, type[Artifact]],
    make_call: Callable[[], StageCall],
    compute: Callable[[StageCall], Artifact],
    use_cache: bool = True,
) -> StageOutcome:
    """The one way a stage runs (QAT or PTQ chain): the cached artifact when its key
    (stage, inputs, config, code version) hits, else ``compute``; saved, indexed and
    recorded in the manifest and the stages/metrics tables; a failure is recorded too."""
    name, cls = stage
    t0 = time.perf_counter()
    run.stage_started(name)
    try:
        call = make_call()
        key = json_digest([name, call.inputs_digest, call.config_digest, call.code_version])
        cached = from_cache(store, run, key, name, cls) if use_cache else None
        written = len(run.debug_written)
        art = cached[0] if cached else keep_debug(run, compute(call), run.debug_written[written:])
        if cached is None:
            art = keep_faults(run, art)
            run.save_artifact(art)
            _index(store, key, run.run_id, name)
    except BaseException as e:  # interrupts too: never leave a stage marked running
        m = run.stage_failed(name, f"{type(e).__name__}: {e}")
        stage_row(run, m.stages[name], time.perf_counter() - t0, None, False)
        raise
    outcome = StageOutcome(
        art, cached is not None, time.perf_counter() - t0, cached[1] if cached else None
    )
    record_stage(run, name, outcome)
    resident.settle()  # the stage's freed tensors, before the next stage (stages.resident)
    return outcome


def _index(store: RunStore, key: str, run_id: str, stage: str) -> None:
    """Record the computed stage in the cache index. An entry that cannot be replaced (a
    folder where it belongs) costs later runs a cache hit, with a warning; it never fails
    the stage, whose artifact is already saved."""
    try:
        store.cache_record(key, {"run_id": run_id, "stage": stage})
    except ArtifactError as e:
        LOG.warning(
            "stage %s: not recorded in the stage cache (%s: %s); remove that entry",
            stage, e.where, e.what,
        )  # fmt: skip


def _stage_call(ctx: RunContext, stage: StageDef, upstream: Artifact | None) -> StageCall:
    digests = [upstream.digest] if upstream else []
    digests += [ctx.data_digest(name) for name in stage.data]
    if ctx.task_metric_digest:  # the metric's code, like the stage's own (code_version)
        digests.append(ctx.task_metric_digest)
    return StageCall(
        stage.name,
        combined_digest(*digests),
        stage_config_digest(ctx.spec, stage.name),
        code_version(),
        versions(),
    )


def from_cache(
    store: RunStore, run: Run, key: str, stage: str, cls: type[Artifact]
) -> tuple[Artifact, str] | None:
    """The cached artifact of ``stage`` linked into ``run``, or None if absent or no
    longer valid (a file missing or failing its digest: recompute, never a wrong hit)."""
    try:
        hit = store.cache_lookup(key)
    except ArtifactError as e:  # a miss, never a wrong hit; computing rewrites the entry
        LOG.warning(
            "stage %s: ignoring a bad stage cache entry (%s: %s); the stage is computed and "
            "the entry rewritten", stage, e.where, e.what,
        )  # fmt: skip
        return None
    if not hit or hit["run_id"] == run.run_id:
        return None
    try:
        src = store.open(hit["run_id"])
        art = src.load_artifact(stage, cls)
    except ArtifactError:
        return None  # deleted or tampered: recompute
    store.reuse_files(src, run, list(art.files))
    run.save_artifact(art)
    restore_debug(run, art)
    restore_faults(run, art)
    return art, hit["run_id"]


def record_stage(run: Run, stage: str, outcome: StageOutcome) -> None:
    m = run.stage_finished(
        stage, outcome.artifact.digest, outcome.cache_hit, cache_source_run=outcome.source_run
    )
    art = outcome.artifact
    stage_row(run, m.stages[stage], outcome.duration_s, art.digest, outcome.cache_hit)
    metrics = getattr(art, "metrics", [])
    rows = [{"run_id": run.run_id, **x.model_dump()} for x in metrics]
    write_rows(run, "metrics", rows, part=stage)


def stage_row(run: Run, rec, duration_s: float, digest: str | None, hit: bool) -> None:
    """The stage's row of the ``stages`` table (one part per stage: reruns replace it)."""
    row = {
        "run_id": run.run_id,
        "stage": rec.stage,
        "status": rec.status,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
        "duration_s": duration_s,
        "artifact_digest": digest,
        "cache_hit": hit,
    }
    write_rows(run, "stages", [row], part=rec.stage)


def finish_run(run: Run, spec: PipelineSpec, error: str | None = None) -> None:
    """Mark the run complete or failed and write its row of the runs table."""
    end_run(run, error, lambda m: write_run_row(run, m, spec))


def end_run(run: Run, error: str | None, write_row: Callable[[Manifest], None]) -> Manifest:
    """The run's final runs row (``write_row(manifest as it ends)``), then its manifest
    marked complete or failed. In this order a run killed in between still says running
    with its owner gone, so the next run or gc marks both interrupted; the other order
    left a complete run whose runs row said running for good."""
    status, end = "failed" if error else "complete", utc_now()
    write_row(
        run.manifest().model_copy(update={"status": status, "finished_at": end, "error": error})
    )
    return run.finish(status, error, finished_at=end)


def write_run_row(run: Run, m: Manifest, spec: PipelineSpec) -> None:
    """The run's row of the runs table as of manifest ``m`` (written at start and end)."""
    write_rows(
        run,
        "runs",
        [
            {
                "run_id": run.run_id,
                "started_at": m.started_at,
                "finished_at": m.finished_at,
                "status": m.status,
                "spec_digest": m.spec_digest,
                "model": spec.model.factory,
                "march": spec.quant.march,
                "consistency_level": str(spec.quant.consistency_level),
                "settings": json.dumps(toolchain_settings(spec), sort_keys=True),
                "code_version": m.code_version,
                "tags": json.dumps(m.tags, sort_keys=True),
            }
        ],
        part="run",
    )
    run.publish()
