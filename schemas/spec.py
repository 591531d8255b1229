"""The pipeline spec: one YAML file that says which model, data and settings a run uses.

Every section has defaults, so the smallest spec is::

    name: digits-cnn
    model: {factory: examples.digits.model:build}
    data: {dataset: examples.digits.data:load}

:func:`load_spec` reads and validates a file; every problem is reported at once, one line
each, naming the file and the dotted key (``spec.yaml: quant.obsrever: unknown key``).
:func:`with_overrides` applies ``--set key=value`` settings, :func:`spec_digest` and
:func:`stage_config_digest` give the content digests that name runs and key the stage cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ValidationError

from schemas.errors import SpecError
from schemas.fileio import json_digest
from schemas.spec_faults import FaultSpec
from schemas.spec_sections import (
    STAGE_METRICS,
    STAGE_NAMES,
    CompareSpec,
    DataSpec,
    LimitsSpec,
    ModelSpec,
    QuantSpec,
    Section,
    StagesSpec,
    check_name,
    tag_value,
)

STAGE_CONFIG_PATHS: dict[str, tuple[str, ...]] = {
    "prepare": ("model", "quant"),
    "calibrate": (
        "model",
        "quant",
        "data.dataset",
        "data.calibration_samples",
        "data.input_format",
        "stages.calibrate",
    ),
    "qat": ("stages.qat",),
    "compile": (
        "quant.march",
        "quant.rounding",
        "stages.convert",
        "stages.board_sim",
        "data.input_format",
        "data.mean",
        "data.std",
    ),
}
"""Dotted spec paths each stage reads itself; its config digest covers exactly these.

Settings of earlier stages still reach a stage through the digest of its input
artifacts. A stage missing here is keyed by its own ``stages.<name>`` section, if any.
"""


class PipelineSpec(Section):
    """A whole pipeline spec, as read from YAML."""

    name: Annotated[str, AfterValidator(check_name)]
    """Name of the pipeline; prefixes its run ids."""
    model: ModelSpec
    """The float model."""
    data: DataSpec
    """The datasets."""
    quant: QuantSpec = QuantSpec()
    """Quantization settings."""
    stages: StagesSpec = StagesSpec()
    """Per-stage settings."""
    compare: CompareSpec = CompareSpec()
    """Comparison settings."""
    tags: dict[str, Annotated[str, BeforeValidator(tag_value)]] = {}
    """Free-form labels copied into the runs table."""
    limits: LimitsSpec = LimitsSpec()
    """Time and memory bounds per stage."""
    faults: list[FaultSpec] = []
    """Faults to inject (schemas.spec_faults): proof that localization works."""


def load_spec(path: str | Path, pipeline: str | None = None) -> PipelineSpec:
    """Read and validate a YAML spec file; any problem is a :class:`SpecError`.

    ``pipeline`` names a named pipeline the spec starts from (as its ``pipeline:`` key
    would; the spec's own values still win)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise SpecError("spec file not found", where=source, hint="check the path") from e
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read the spec file ({e})", where=source) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(_yaml_problem(e), where=source, hint="fix the YAML syntax") from e
    if pipeline is not None and isinstance(data, dict):
        data = {**data, "pipeline": pipeline}
    return parse_spec(data, source)


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    if mark is None:
        return f"not valid YAML: {problem}"
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def parse_spec(data: Any, source: str) -> PipelineSpec:
    """Validate already-parsed spec data; ``source`` names it in error messages."""
    if data is None:
        raise SpecError("the spec is empty", where=source, hint="give at least name, model, data")
    if not isinstance(data, dict):
        raise SpecError(
            f"the top level must be a mapping of sections, got {type(data).__name__}",
            where=source,
            hint=f"use keys: {', '.join(PipelineSpec.model_fields)}",
        )
    if "pipeline" in data:
        data = with_pipeline(data, source)
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as e:
        raise _spec_error(e, source) from e
    check_primary(spec, source)
    return spec


def check_primary(spec, source: str) -> None:
    """compare.primary must be a metric the run can record: a stage metric, or any name
    when data.metric may return it (checked when the stages record their metrics);
    ``spec``: a pipeline spec or a PTQ spec."""
    primary = spec.compare.primary
    if primary is None or primary in STAGE_METRICS or spec.data.metric is not None:
        return
    raise SpecError(
        f"compare.primary: {primary!r} is not a metric the run records",
        where=source,
        hint=f"use one of {', '.join(STAGE_METRICS)}, or a name data.metric returns",
    )


NAMED_PIPELINES = Path(__file__).resolve().parent.parent / "pipelines" / "named"
"""Named pipelines: spec fragments (stages to run, analysis on/off) a spec can start from."""


def with_pipeline(data: dict, source: str, folder: Path = NAMED_PIPELINES) -> dict:
    """``data`` over the fragment its ``pipeline`` key names in ``folder`` (the spec's own
    values win). PTQ specs use ``pipelines/named/ptq/``."""
    data = dict(data)
    name = data.pop("pipeline")
    known = sorted(p.stem for p in folder.glob("*.yaml"))
    if not isinstance(name, str) or name not in known:
        raise SpecError(
            f"pipeline: unknown named pipeline {name!r}",
            where=source,
            hint=f"use one of: {', '.join(known)} ({folder.relative_to(folder.parents[1])}/*.yaml)",
        )
    fragment = yaml.safe_load((folder / f"{name}.yaml").read_text()) or {}
    return _merge(fragment, data)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def _spec_error(exc: ValidationError, source: str) -> SpecError:
    problems = [_describe(err) for err in exc.errors(include_url=False)]
    if len(problems) == 1:
        what, hint = problems[0]
        return SpecError(what, where=source, hint=hint)
    lines = [f"  {what}" + (f". Fix: {hint}" if hint else "") for what, hint in problems]
    hint = "correct each key listed above"
    return SpecError(f"{len(problems)} problems:\n" + "\n".join(lines), where=source, hint=hint)


def _describe(err: Any) -> tuple[str, str | None]:
    """One validation error as (what, hint), the key spelled as a dotted path."""
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        section = _section_model(err["loc"][:-1])
        allowed = ", ".join(sorted(section.model_fields)) if section else "?"
        return f"{loc}: unknown key", f"remove it or use one of: {allowed}"
    if kind == "missing":
        return f"{loc}: required key is missing", f"add {loc} (see the example specs)"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        got = type(err["input"]).__name__
        return f"{loc}: expected a mapping, got {got}", f"write {loc} as key: value lines"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg[0].lower()}{msg[1:]}, got {_short(err['input'])}", f"correct {loc}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class at ``loc`` inside PipelineSpec, or None if it is not a model."""
    cls: type[BaseModel] = PipelineSpec
    for part in loc:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        cls = ann
    return cls


def with_overrides(spec: PipelineSpec, settings: list[str]) -> PipelineSpec:
    """Apply ``key.path=value`` settings (values parsed as YAML) and revalidate."""
    data = spec.model_dump(mode="json")
    for setting in settings:
        key, sep, raw = setting.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"setting {setting!r} is not key=value", hint="e.g. quant.march=nash-m")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise SpecError(
                f"{key}: value {raw!r} is not valid YAML",
                where="--set",
                hint="close its brackets and quotes, or quote it whole: --set 'k=\"[a\"'",
            ) from e
        _set_path(data, key.strip().split("."), value)
    return parse_spec(data, "--set")


def _set_path(data: dict[str, Any], parts: list[str], value: Any) -> None:
    """Set ``value`` at ``parts``; keys below a dict field (overrides, tags) join back with '.'."""
    cls: type[BaseModel] = PipelineSpec
    node = data
    for i, part in enumerate(parts):
        if part not in cls.model_fields:
            where = ".".join(parts[: i + 1])
            allowed = ", ".join(sorted(cls.model_fields))
            raise SpecError(f"{where}: unknown key", where="--set", hint=f"use one of: {allowed}")
        ann = cls.model_fields[part].annotation
        rest = parts[i + 1 :]
        if not rest:
            node[part] = value
            return
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            cls, node = ann, node.setdefault(part, {})
            continue
        if isinstance(node.get(part), dict):  # a free mapping: the rest is one key
            node[part] = {**node[part], ".".join(rest): value}
            return
        raise SpecError(f"{'.'.join(parts)}: {part} has no sub-keys", where="--set")


def spec_digest(spec: PipelineSpec) -> str:
    """sha256 hex of the spec's canonical JSON (sorted keys, defaults filled in)."""
    return json_digest(spec.model_dump(mode="json"))


def stage_config_digest(spec: PipelineSpec, stage: str) -> str:
    """sha256 hex of exactly the spec parts ``stage`` reads (see STAGE_CONFIG_PATHS)."""
    if stage not in STAGE_NAMES:
        raise SpecError(f"unknown stage {stage!r}", hint=f"use one of: {', '.join(STAGE_NAMES)}")
    data = spec.model_dump(mode="json")
    paths = STAGE_CONFIG_PATHS.get(stage)
    if paths is None:
        paths = (f"stages.{stage}",) if stage in data["stages"] else ()
    parts = {path: _get_path(data, path) for path in paths}
    if data["data"]["metric"] is not None:  # every stage records the task metric
        parts["data.metric"] = data["data"]["metric"]
    faults = [f for f in data["faults"] if f["stage"] == stage]
    if faults:  # only a stage's own faults enter its digest (a clean spec keeps its keys)
        parts["faults"] = faults
    return json_digest(parts)


def _get_path(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node[part]
    return node
