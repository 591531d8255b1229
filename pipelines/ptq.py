"""The PTQ chain as a run: an ONNX float model in, one run in the store out.

``run_ptq(onnx_path, spec, store_root)`` creates a run named after the model file's stem,
runs :data:`stages.ptq.chain.STAGES` in order and records each like the QAT chain does:
the manifest (stage_started / stage_finished / stage_failed), the ``stages`` and
``metrics`` tables (pipelines.runs' row writers) and, at the end, the ``runs`` table.
The run's row of ``runs`` is written at start too (status running); runs whose process
died are marked interrupted first (:mod:`pipelines.gc`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError

from pipelines.gc import mark_interrupted
from pipelines.runs import end_run, run_recorded, versions
from schemas.artifacts import combined_digest
from schemas.errors import SpecError
from schemas.fileio import json_digest, sha256_file
from schemas.manifest import Manifest
from schemas.owner import heartbeat
from schemas.paths import checked_file, checked_path
from schemas.spec import NAMED_PIPELINES, check_primary, with_pipeline
from schemas.spec_sections import CompareSpec, Dtype, Factory, PosInt, Section
from schemas.store import Run, RunStore
from schemas.tables import write_rows
from simulator.program.march import MARCHES
from stages import resident
from stages.data import load_splits
from stages.loader import import_object
from stages.ptq import feeds
from stages.ptq.calibrate_onnx import QuantConfig
from stages.ptq.chain import STAGES, PtqStage
from stages.ptq.context import PtqContext, PtqModel
from stages.registry import code_version
from stages.registry_types import StageCall


class PtqModelSpec(Section):
    """Where the ONNX float model comes from."""

    file: str
    """Path of the ONNX float model (relative paths: to the working directory)."""
    export: Factory | None = None
    """Optional 'module:function' called with ``file`` that writes the ONNX model there
    first (the bundled example exports its torch model this way)."""
    input_shapes: dict[str, list[int]] = {}
    """Fixed input shapes by input name (the vendor's ``input_shape``), e.g. ``{images: [1,
    3, 320, 320]}``: dynamic dims take these sizes (dim 0, the batch, stays dynamic: it
    fixes the batch only where the size computations do not fold otherwise, and
    ``original`` makes it dynamic again) and ``original`` folds the shape-computing
    subgraphs into constants."""


class PtqDataSpec(Section):
    """The dataset (same convention as data.dataset of a pipeline spec)."""

    dataset: Factory
    """'module:function' returning {"train": split, "evaluation": split}, each split (x, y)
    or {"inputs": {name: x}, "labels": y or None} (stages.data); without labels every stage
    is judged by its agreement with the original model."""
    calibration_samples: PosInt = 256
    """Samples the activation ranges are calibrated on."""
    evaluation_samples: PosInt = 1000
    """Samples every stage's top-1 is measured on."""
    batch_size: PosInt = 100
    """Batch size of calibration and evaluation."""
    probe_samples: PosInt = 4
    """Samples the hbm is checked bit for bit against quantized on."""
    metric: Factory | None = None
    """'module:function' of a task metric (mAP, mIoU...), the QAT chain's ``data.metric``:
    called with a stage's outputs, the original model's outputs and the labels (or None),
    it returns ``{name: float}``; every stage records the names, which may be
    ``compare.primary``. Null: none."""


class PtqQuantSpec(Section):
    """The quant config: dtypes and the target march."""

    activation_dtype: Dtype = "int8"
    """Activation dtype of every quantizer (all int8 or all int16)."""
    overrides: dict[str, Dtype] = {}
    """Per-node activation dtype, by node name of the ONNX model or by layer id."""
    march: Literal["nash-e", "nash-m", "nash-p", "nash-h", "nash-b"] = "nash-e"
    """The BPU march: weight dtypes, multiplier width, LUT shape, channel alignment."""


def _check_ptq_stage(name: str | None) -> str | None:
    names = [s.name for s in STAGES]
    if name is not None and name not in names:
        raise ValueError(f"unknown PTQ stage {name!r}: expected one of {', '.join(names)}")
    return name


class PtqStagesSpec(Section):
    """Which PTQ stages run."""

    stop_after: Annotated[str | None, AfterValidator(_check_ptq_stage)] = None
    """Stop the chain after this stage; null runs every stage."""


class PtqCompareSpec(Section):
    """What the stages are judged by (the QAT chain's ``compare.output`` and ``primary``)."""

    output: str | None = Field(default=None, pattern=r"^output(\.[\w]+)*$")
    """The output id (stages.ptq.feeds: ``output`` for one output, ``output.<onnx name>``
    or ``output.<k>`` for several) labels, top1 and localization apply to; null: the
    first class-like ((N, C)) output, else the first. Every output gets its metrics."""
    primary: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*$")
    """The metric ``qparity localize`` and the stage table judge by: ``top1``,
    ``top1_agreement``, ``cosine``, ``sqnr_db``, ``l1`` or a name ``data.metric`` returns;
    null: top1 when the dataset has labels, else cosine."""


class PtqSpec(Section):
    """A PTQ chain spec (examples/digits_ptq/spec.yaml); ``pipeline:`` may name a fragment
    of pipelines/named/ptq/ it starts from."""

    model: PtqModelSpec
    """The ONNX float model."""
    data: PtqDataSpec
    """Calibration and evaluation data."""
    quant: PtqQuantSpec = PtqQuantSpec()
    """Dtypes and march."""
    stages: PtqStagesSpec = PtqStagesSpec()
    """Which stages run."""
    compare: PtqCompareSpec = PtqCompareSpec()
    """The judged output."""
    optimized_cosine: float = 0.999
    """Per-layer cosine the optimized model must keep against the original."""
    tags: dict[str, str] = {}
    """Labels recorded with the run."""

    def judging(self) -> CompareSpec:
        """The compare section as the QAT chain's stages and analysis read it (its
        thresholds the defaults)."""
        c = self.compare
        return CompareSpec(
            output=c.output, primary=c.primary, probe_samples=self.data.probe_samples
        )


def load_ptq_spec(path: Path) -> tuple[PtqSpec, str]:
    """(validated spec, its text); errors name the file and the field."""
    try:
        text = Path(path).read_text()
        data = yaml.safe_load(text)
        if isinstance(data, dict) and "pipeline" in data:
            data = with_pipeline(data, str(path), NAMED_PIPELINES / "ptq")
        spec = PtqSpec.model_validate(data)
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e}", where=str(path)) from e
    except (yaml.YAMLError, ValidationError) as e:
        raise SpecError(f"invalid PTQ spec: {e}", where=str(path),
                        hint="see examples/digits_ptq/spec.yaml") from e  # fmt: skip
    check_primary(spec, str(path))
    return spec, text


def model_path(spec: PtqSpec) -> Path:
    """The ONNX file of the spec, written first by ``model.export`` when one is given.

    ``model.file`` must lie inside the allowed roots (:mod:`schemas.paths`) before the
    export writes it, and still after (the export may have left a symlink); an existing
    file must be a regular one. A missing file is left to the original stage to report."""
    path = checked_path(spec.model.file, "model.file")
    if spec.model.export:
        import_object(spec.model.export, field="model.export")(path)
    if path.is_symlink() or path.exists():
        return checked_file(path, "model.file")
    return path


def run_ptq(
    onnx_path: Path,
    spec: PtqSpec,
    store_root: str | Path,
    spec_text: str = "",
    stop_after: str | None = None,
    use_prefect: bool = False,
) -> str:
    """Run the PTQ chain on ``onnx_path`` through ``stop_after`` (else the spec's
    ``stages.stop_after``), as a Prefect flow with one task per stage when ``use_prefect``;
    returns the run id. A failing stage is recorded in the run, then its error is raised."""
    names = [s.name for s in STAGES]
    stop_after = _check_spec_stage(stop_after) or spec.stages.stop_after
    onnx_path = Path(onnx_path)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", onnx_path.stem) or "model"
    resident.tune_malloc()  # before Prefect's and the comparison's threads start
    store = RunStore(store_root)
    mark_interrupted(store)
    run = store.create_run(
        name, spec_text or yaml.safe_dump(spec.model_dump(mode="json")), json_digest(spec.model_dump(mode="json")),
        code_version(), versions(), dict(spec.tags), judging=spec.judging().as_judging(),
    )  # fmt: skip
    _write_run_row(run, run.manifest(), spec, onnx_path)
    error = None
    try:
        ctx = _context(run, name, onnx_path, spec)
        stages = STAGES[: names.index(stop_after or names[-1]) + 1]
        with heartbeat(run.heartbeat):
            _run_stages(
                lambda stage, up: _execute(store, ctx, stage, up, spec), stages, run, use_prefect
            )
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        _finish(run, spec, onnx_path, error)
    return run.run_id


def _context(run: Run, name: str, path: Path, spec: PtqSpec) -> PtqContext:
    d, q = spec.data, spec.quant
    splits = load_splits(d.dataset, d.calibration_samples, d.evaluation_samples)
    splits = feeds.align_splits(splits, path)
    quant = QuantConfig(q.activation_dtype, dict(q.overrides))
    return PtqContext(run, name, path, quant, MARCHES[q.march], splits, d.batch_size,
                      d.probe_samples, spec.optimized_cosine,
                      {k: list(v) for k, v in spec.model.input_shapes.items()},
                      spec.judging(), d.metric)  # fmt: skip


def _check_spec_stage(name: str | None) -> str | None:
    try:
        return _check_ptq_stage(name)
    except ValueError as e:
        raise SpecError(str(e), where="stop_after") from e


def _run_stages(run_one, stages, run: Run, use_prefect: bool) -> None:
    """The stages in order, each fed the one before: directly, or as a Prefect flow."""
    if use_prefect:
        from pipelines.flow import prefect_ready, ptq_flow, with_quiet_prefect

        prefect_ready()
        with_quiet_prefect(lambda: ptq_flow(run_one, stages, run.run_id))
        return
    upstream = None
    for stage in stages:
        upstream = run_one(stage, upstream)


def _execute(store: RunStore, ctx: PtqContext, stage: PtqStage, upstream: PtqModel | None,
             spec: PtqSpec):  # fmt: skip
    """One stage through the run store's one stage runner (cache, manifest, tables)."""

    def make_call() -> StageCall:
        digests = [upstream.digest] if upstream else [_source_digest(ctx.source)]
        digests += [ctx.splits[s].digest for s in stage.reads]
        judged = [spec.compare.output] if spec.compare.output else []  # old keys kept
        task = [spec.data.metric, ctx.task_metric_digest] if spec.data.metric else []
        config = json_digest([stage.name, spec.quant.model_dump(mode="json"),
                              spec.optimized_cosine, *judged, *task])  # fmt: skip
        return StageCall(stage.name, combined_digest(*digests), config, code_version(), versions())

    outcome = run_recorded(
        store, ctx.run, (stage.name, PtqModel), make_call, lambda c: stage.fn(upstream, ctx, c)
    )
    return outcome.artifact


def _source_digest(path: Path) -> str:
    """The ONNX file's content digest (a missing file: its path; the stage says what's wrong)."""
    return sha256_file(path) if path.is_file() else json_digest(str(path))


def _finish(run: Run, spec: PtqSpec, path: Path, error: str | None) -> None:
    """Mark the run complete or failed; its row of the runs table."""
    end_run(run, error, lambda m: _write_run_row(run, m, spec, path))


def _write_run_row(run: Run, m: Manifest, spec: PtqSpec, path: Path) -> None:
    """The run's row of the runs table as of manifest ``m`` (written at start and end)."""
    settings = {"chain": "ptq", **spec.quant.model_dump(mode="json")}
    row = {
        "run_id": run.run_id, "started_at": m.started_at, "finished_at": m.finished_at,
        "status": m.status, "spec_digest": m.spec_digest, "model": str(path),
        "march": spec.quant.march, "consistency_level": "ptq",
        "settings": json.dumps(settings, sort_keys=True), "code_version": m.code_version,
        "tags": json.dumps(m.tags, sort_keys=True),
    }  # fmt: skip
    write_rows(run, "runs", [row], part="run")
    run.publish()
