"""The sections of a pipeline spec: one pydantic model each, every field documented.

``schemas.spec`` assembles them into :class:`~schemas.spec.PipelineSpec` and loads files.
All models forbid unknown keys and are frozen.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from schemas.manifest import Judging
from schemas.stage_names import STAGE_NAMES

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FACTORY_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def check_name(value: str) -> str:
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


def tag_value(value: Any) -> Any:
    return str(value) if isinstance(value, int | float | bool) else value


Factory = Annotated[str, AfterValidator(_check_factory)]
PosInt = Annotated[int, Field(strict=True, gt=0)]
Dtype = Literal["int8", "int16"]


STAGE_METRICS = ("top1", "top1_agreement", "cosine", "sqnr_db", "l1")
"""The metrics every stage records per output (top1 only when the dataset has labels)."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Section):
    """Where the float model comes from."""

    factory: Factory
    """'module.path:function' returning a torch.nn.Module (checked for shape, not imported)."""
    weights: str | None = None
    """Path to a safetensors file; null lets the factory provide (or train) the weights."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments the factory is called with, e.g. ``timm:create_model`` with
    ``{model_name: resnet18, num_classes: 10}``; YAML values (numbers, strings, lists, maps)."""


class DataSpec(Section):
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
    metric: Factory | None = None
    """'module:function' of a task metric (mAP, mIoU...): called with a stage's outputs, the
    float model's outputs and the labels (or None), it returns ``{name: float}``; the names
    join every stage's metrics and may be ``compare.primary``. Null: none."""


class QuantSpec(Section):
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


class PrepareConfig(Section):
    """Settings of the prepare stage (none yet; everything comes from `quant`)."""


class CalibrateConfig(Section):
    """Settings of the calibrate stage."""

    batch_size: PosInt = 64
    """Batch size of calibration forward passes."""


class QatConfig(Section):
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


class PreExportConfig(Section):
    """Settings of pre_export: which table ops become fixed point, and the table shapes."""

    subtree: list[str] = []
    """Module paths to apply pre_export to (the vendor's partial pre_export); empty: all."""
    segments: PosInt = 6
    """Segments of an int16-input table."""
    entries: int = Field(default=64, ge=2, strict=True)
    """Entries per segment of an int16-input table."""
    dividing: Literal["even", "curvature"] = "even"
    """How segment dividing points are placed: evenly, or by the function's curvature."""


class ConvertConfig(Section):
    """Settings of convert (quantized.onnx): the integer arithmetic."""

    multiplier_bits: int | None = Field(default=None, ge=8, le=32, strict=True)
    """Signed width of requantize multipliers (|m| < 2**(bits-1)); null: 16, or 32 with
    high_precision_qpp."""
    rounding: Literal["half_even", "bpu_round"] | None = None
    """Rounding of requantize and bias; null: quant.rounding."""
    saturation_warning: float = Field(default=0.5, gt=0, le=1)
    """Warn (debug/convert_advisor.txt) when more than this share of a layer's outputs
    sit at the integer limits on the calibration samples checked."""
    saturation_samples: int = Field(default=16, ge=1, strict=True)
    """Calibration samples the saturation check runs on (at most ``stages.calibrate.
    batch_size``): the reference evaluator captures every layer of each, a few seconds a
    sample at 224x224, and a share over millions of values settles within a few samples."""


class BoardSimConfig(Section):
    """Settings of board_sim: the board's own input path."""

    runtime_format: Literal["featuremap", "nv12", "yuv444", "rgb", "bgr", "gray"] = "featuremap"
    """What the camera delivers on the board; featuremap feeds the evaluation inputs as is."""
    color: Literal["bt601_full", "bt601_video"] = "bt601_full"
    """Colour conversion standard between YUV and RGB on the board."""


class ExportConfig(Section):
    """Settings of export (qat.onnx); none yet: the graph is opset 21 + the qparity domain."""


class StagesSpec(Section):
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
    run: list[Annotated[str, AfterValidator(_check_stage)]] | None = None
    """Run only these stages and what they need (their upstream, from the registry's
    dependencies; cached upstream is a cache hit); null runs every enabled stage."""
    cached_only: bool = False
    """Take every stage from the stage cache and never compute one: a stage that is not
    cached fails the run (re-analysis of a finished chain: ``pipeline: analysis_only``)."""


class Thresholds(Section):
    """Pass/fail thresholds of a comparison between two stages."""

    cosine: float = Field(default=0.999, ge=-1, le=1)
    """Lowest acceptable cosine similarity of outputs."""
    max_qscale_diff: float = Field(default=1.0, ge=0)
    """Largest acceptable difference, in quantization steps."""
    top1_drop: float = Field(default=0.005, ge=0)
    """Largest acceptable drop of top-1 accuracy (a fraction)."""
    primary_drop: float | None = Field(default=None, ge=0)
    """Largest acceptable worsening of ``compare.primary`` when it is not top1 (a drop; a
    rise for l1); null: ``top1_drop``."""


class LimitsSpec(Section):
    """Bounds on every stage; a stage past one fails cleanly and says which."""

    stage_seconds: float | None = Field(default=None, gt=0)
    """Wall time a stage may take (null: no limit)."""
    stage_memory_mb: float | None = Field(default=None, gt=0)
    """Resident memory a stage may add to the process, MB (null: no limit)."""


class CompareSpec(Section):
    """How stages are compared."""

    thresholds: Thresholds = Thresholds()
    """Pass/fail thresholds."""
    probe_samples: int = Field(default=4, ge=0, strict=True)
    """Samples whose full layer tensors are kept."""
    badcase_metric: Literal["l1", "mse", "cosine", "sqnr", "flip"] = "l1"
    """How bad cases are ranked: output L1 (the vendor's default), mse, cosine, sqnr, or a
    flip of the task's correctness (without labels: a changed arg-max prediction)."""
    enabled: bool = True
    """Run the analysis (compare, bad cases, localization) after the chain."""
    steps: list[Literal["report"]] = []
    """Analysis steps added after localization, each its own Prefect task: ``report``
    writes the run's HTML report to <run>/report.html (as ``qparity report RUN``)."""
    primary: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*$")
    """The metric localization thresholds, sweeps, ``show`` and the report use (bad cases
    are ranked per sample by ``badcase_metric``): one a
    run records (``top1``, ``top1_agreement``, ``cosine``, ``sqnr_db``, ``l1`` or a name
    ``data.metric`` returns); null: top1 when the dataset has labels, else cosine."""
    output: str | None = Field(default=None, pattern=r"^output(\.[\w]+)*$")
    """The model output (canonical id: ``output``, ``output.0``, ``output.boxes``) labels,
    top1 and the primary metric apply to; null: the first class-like ((N, C)) output, else
    the first (stages.outputs)."""
    samples: int | None = Field(default=32, ge=1)
    """Compare layers on the first N evaluation samples (null: all of them): the stage
    models rerun with every layer captured, the analysis' main cost. Outputs (and so the
    bad cases) are compared on every sample, from what the stages stored, and the stages'
    metrics (top-1...) are always measured on the whole split."""
    memory_mb: float = Field(default=512, gt=0)
    """MB of captured layer tensors the comparison holds at once: it runs the stage models
    one by one on batches of ``data.batch_size`` samples, fewer when the most models'
    layers it holds at once (three: the QAT reference's, the previous stage's, the current
    one's) of that many samples would pass this (measured on one sample; at least one
    sample per batch). 512: ResNet-50@224's three captures are about 300 MB a sample, so
    its comparison runs a frame at a time and its analysis stays under 3 GB."""

    def as_judging(self) -> Judging:
        """What a run of this section is judged by, as its manifest records it."""
        t = self.thresholds
        return Judging(primary=self.primary, output=self.output, top1_drop=t.top1_drop,
                       primary_drop=t.primary_drop)  # fmt: skip
