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

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from schemas.errors import SpecError
from schemas.fileio import json_digest

STAGE_NAMES: tuple[str, ...] = (
    "prepare",
    "calibrate",
    "qat",
    "pre_export",
    "export",
    "convert",
    "compile",
    "board_sim",
)
"""Every stage of the chain, in chain order (the card's names)."""

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

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FACTORY_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _check_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(
            "expected letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _check_factory(value: str) -> str:
    if not _FACTORY_RE.match(value):
        raise ValueError("expected 'module.path:function', e.g. examples.digits.model:build")
    return value


def _check_stage(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.replace("-", "_")  # the command line spells it board-sim
    if value not in STAGE_NAMES:
        raise ValueError(f"expected one of: {', '.join(STAGE_NAMES)}")
    return value


def _reject_bool(value: Any) -> Any:
    if isinstance(value, bool):  # YAML `yes` must not pass as level 1
        raise ValueError("expected none, 0, 1 or 2")
    return value


def _tag_value(value: Any) -> Any:
    return str(value) if isinstance(value, int | float | bool) else value


Factory = Annotated[str, AfterValidator(_check_factory)]
PosInt = Annotated[int, Field(strict=True, gt=0)]
Dtype = Literal["int8", "int16"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ModelSpec(_Section):
    """Where the float model comes from."""

    factory: Factory
    """'module.path:function' returning a torch.nn.Module (checked for shape, not imported)."""
    weights: str | None = None
    """Path to a safetensors file; null lets the factory provide (or train) the weights."""


class DataSpec(_Section):
    """Which dataset feeds calibration and evaluation, and how much of it."""

    dataset: Factory
    """'module:function' returning the calibration and evaluation splits."""
    calibration_samples: PosInt = 256
    """Samples used to calibrate the observers."""
    evaluation_samples: PosInt = 1000
    """Samples every stage model is evaluated on."""
    batch_size: PosInt = 100
    """Batch size for evaluation and capture."""
    input_format: Literal["rgb", "bgr", "yuv444", "gray", "featuremap"] = "featuremap"
    """The input layout the model saw in training."""
    mean: list[float] = []
    """Per-channel mean in pixel units (0..255) the training inputs were normalized with:
    ``x = (pixel - mean) / std``; the board folds it into its input path. Empty: 0."""
    std: list[float] = []
    """Per-channel std in pixel units; empty: 1."""


class QuantSpec(_Section):
    """Quantization settings, applied at prepare."""

    march: Literal["nash-e", "nash-m", "nash-p", "nash-h", "nash-b"] = "nash-e"
    """The BPU micro-architecture to target."""
    activation_dtype: Dtype = "int8"
    """Default activation dtype."""
    overrides: dict[str, Dtype] = {}
    """Activation dtype by module path of the float model, e.g. {head.fc: int16}."""
    observer: Literal["minmax", "moving_average_minmax", "percentile", "mse"] = "minmax"
    """How calibration turns statistics into scales."""
    percentile: float = Field(default=99.99, gt=0, le=100)
    """Percentile kept by the percentile observer, in (0, 100]."""
    averaging_constant: float = Field(default=0.01, gt=0, le=1)
    """Update weight of the moving-average observer, in (0, 1]."""
    rounding: Literal["half_even", "bpu_round"] = "half_even"
    """Tie rule of fake quant: half to even, or the BPU's half away from zero."""
    consistency_level: Annotated[Literal["none", 0, 1, 2], BeforeValidator(_reject_bool)] = "none"
    """Consistency strategy: none, 0 (wide requantize), 1 (pow2 activations), 2 (pow2 all)."""
    high_precision_output: bool = True
    """Conv/linear model outputs stay unquantized (int32 on the board)."""
    weight_dtype: Dtype = "int8"
    """Conv/linear weight dtype; the march must support it (Nash: int8 only)."""
    fuse_requantize: bool | None = None
    """Requantize conv/linear + add once (no quantizer between them); null: the
    consistency level's default (off at level 0, on otherwise)."""
    high_precision_qpp: bool | None = None
    """Wide (32-bit) requantize multipliers; null: the level's default (on at level 0)."""


class PrepareConfig(_Section):
    """Settings of the prepare stage (none yet; everything comes from `quant`)."""


class CalibrateConfig(_Section):
    """Settings of the calibrate stage."""

    batch_size: PosInt = 64
    """Batch size of calibration forward passes."""


class QatConfig(_Section):
    """Settings of the optional quantization-aware fine-tuning stage."""

    enabled: bool = False
    """Run QAT fine-tuning at all."""
    steps: int = Field(default=200, ge=0, strict=True)
    """Optimizer steps."""
    lr: float = Field(default=1e-3, gt=0)
    """Learning rate."""
    batch_size: PosInt = 32
    """Training batch size."""
    seed: int = Field(default=0, strict=True)
    """Seed of data order and any randomness in training."""


class PreExportConfig(_Section):
    """Settings of pre_export: which table ops become fixed point, and the table shapes."""

    subtree: list[str] = []
    """Module paths to apply pre_export to (the vendor's partial pre_export); empty: all."""
    segments: PosInt = 6
    """Segments of an int16-input table."""
    entries: int = Field(default=64, ge=2, strict=True)
    """Entries per segment of an int16-input table."""
    dividing: Literal["even", "curvature"] = "even"
    """How segment dividing points are placed: evenly, or by the function's curvature."""


class ConvertConfig(_Section):
    """Settings of convert (quantized.onnx): the integer arithmetic."""

    multiplier_bits: int | None = Field(default=None, ge=8, le=32, strict=True)
    """Signed width of requantize multipliers (|m| < 2**(bits-1)); null: 16, or 32 with
    high_precision_qpp."""
    rounding: Literal["half_even", "bpu_round"] | None = None
    """Rounding of requantize and bias; null: quant.rounding."""
    saturation_warning: float = Field(default=0.5, gt=0, le=1)
    """Warn (debug/convert_advisor.txt) when more than this share of a layer's outputs
    sit at the integer limits on the calibration samples."""


class BoardSimConfig(_Section):
    """Settings of board_sim: the board's own input path."""

    runtime_format: Literal["featuremap", "nv12", "yuv444", "rgb", "bgr", "gray"] = "featuremap"
    """What the camera delivers on the board; featuremap feeds the evaluation inputs as is."""
    color: Literal["bt601_full", "bt601_video"] = "bt601_full"
    """Colour conversion standard between YUV and RGB on the board."""


class ExportConfig(_Section):
    """Settings of export (qat.onnx); none yet: the graph is opset 21 + the qparity domain."""


class StagesSpec(_Section):
    """Per-stage settings, and where to stop."""

    prepare: PrepareConfig = PrepareConfig()
    """Settings of prepare."""
    calibrate: CalibrateConfig = CalibrateConfig()
    """Settings of calibrate."""
    qat: QatConfig = QatConfig()
    """Settings of qat."""
    pre_export: PreExportConfig = PreExportConfig()
    """Settings of pre_export."""
    export: ExportConfig = ExportConfig()
    """Settings of export."""
    convert: ConvertConfig = ConvertConfig()
    """Settings of convert."""
    board_sim: BoardSimConfig = BoardSimConfig()
    """Settings of board_sim."""
    stop_after: Annotated[str | None, AfterValidator(_check_stage)] = None
    """Stop the chain after this stage; null runs every stage."""


class Thresholds(_Section):
    """Pass/fail thresholds of a comparison between two stages."""

    cosine: float = Field(default=0.999, ge=-1, le=1)
    """Lowest acceptable cosine similarity of outputs."""
    max_qscale_diff: float = Field(default=1.0, ge=0)
    """Largest acceptable difference, in quantization steps."""
    top1_drop: float = Field(default=0.005, ge=0)
    """Largest acceptable drop of top-1 accuracy (a fraction)."""


class CompareSpec(_Section):
    """How stages are compared."""

    thresholds: Thresholds = Thresholds()
    """Pass/fail thresholds."""
    probe_samples: int = Field(default=4, ge=0, strict=True)
    """Samples whose full layer tensors are kept."""


class PipelineSpec(_Section):
    """A whole pipeline spec, as read from YAML."""

    name: Annotated[str, AfterValidator(_check_name)]
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
    tags: dict[str, Annotated[str, BeforeValidator(_tag_value)]] = {}
    """Free-form labels copied into the runs table."""


def load_spec(path: str | Path) -> PipelineSpec:
    """Read and validate a YAML spec file; any problem is a :class:`SpecError`."""
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
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as e:
        raise _spec_error(e, source) from e


def _spec_error(exc: ValidationError, source: str) -> SpecError:
    problems = [_describe(err) for err in exc.errors(include_url=False)]
    if len(problems) == 1:
        what, hint = problems[0]
        return SpecError(what, where=source, hint=hint)
    lines = [f"  {what}" + (f". Fix: {hint}" if hint else "") for what, hint in problems]
    return SpecError(f"{len(problems)} problems:\n" + "\n".join(lines), where=source)


def _describe(err: Any) -> tuple[str, str | None]:
    """One validation error as (what, hint), the key spelled as a dotted path."""
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        section = _section_model(err["loc"][:-1])
        allowed = ", ".join(sorted(section.model_fields)) if section else "?"
        return f"{loc}: unknown key", f"remove it or use one of: {allowed}"
    if kind == "missing":
        return f"{loc}: required key is missing", None
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{loc}: expected a mapping, got {type(err['input']).__name__}", None
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg[0].lower()}{msg[1:]}, got {_short(err['input'])}", None


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
            raise SpecError(f"{key}: value {raw!r} is not valid YAML", where="--set") from e
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
    return json_digest({path: _get_path(data, path) for path in paths})


def _get_path(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node[part]
    return node
