"""Artifacts: what a stage hands to the next, as pydantic models.

An artifact names the files it owns (paths relative to the run folder, with their
sha256), the digests of its inputs and of the stage config that made it, and the code
and library versions. Concrete artifacts subclass :class:`Artifact` and narrow ``kind``
with a ``Literal``. Its :attr:`Artifact.digest` leaves out ``created_at`` so that an
identical recompute has an identical digest.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.fileio import json_digest, utc_now

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def combined_digest(*digests: str) -> str:
    """One digest for an ordered list of digests (order matters; none is allowed)."""
    for d in digests:
        if not isinstance(d, str) or not _SHA256_RE.match(d):
            raise ValueError(f"not a sha256 hex digest: {d!r}")
    return json_digest(list(digests))


class Artifact(BaseModel):
    """Base of every stage artifact."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    # defer_build: a model's validator is built when first used, so a process that reads
    # one kind (`qparity show`: convert's) does not build all ten (~20 ms; bench/cli.py)

    kind: str
    """What the artifact is; subclasses narrow it with a Literal."""
    stage: str
    """The stage that made it."""
    files: dict[str, str]
    """Owned files: path relative to the run folder -> sha256 hex."""
    inputs_digest: str
    """Digest of the input artifacts (combined_digest of their .digest)."""
    config_digest: str
    """Digest of the stage config that made it."""
    code_version: str
    """Version of the stage code."""
    versions: dict[str, str] = {}
    """Versions of the libraries involved (torch, onnx, ...)."""
    debug: list[str] = []
    """Files the stage wrote to the run's debug folder, by name; each is also one of
    ``files``, as ``artifacts/<stage>/debug/<name>``, so a cache hit restores them."""
    created_at: str = Field(default_factory=utc_now)
    """ISO-8601 UTC creation time (not part of the digest)."""

    @field_validator("files")
    @classmethod
    def _check_files(cls, files: dict[str, str]) -> dict[str, str]:
        for rel, digest in files.items():
            parts = rel.split("/")
            if rel.startswith("/") or "\\" in rel or ".." in parts or "" in parts:
                raise ValueError(f"file path {rel!r} must be relative, '/'-separated, no '..'")
            if not _SHA256_RE.match(digest):
                raise ValueError(f"file {rel!r}: {digest!r} is not a sha256 hex digest")
        return files

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON of everything but ``created_at``."""
        return json_digest(self.model_dump(mode="json", exclude={"created_at"}))


class Metric(BaseModel):
    """One dataset-level judgement of a stage model (a row of the ``metrics`` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    stage: str
    """The stage whose model was measured (``float`` for the float model)."""
    metric: str
    """What was measured, e.g. ``top1``."""
    value: float
    """The measured value."""
    n_samples: int
    """How many evaluation samples it was measured on."""
    output: str | None = None
    """The model output it judges (``output`` for a single-tensor output); null for a
    task metric (data.metric) or a count such as float_islands."""


class QatModelArtifact(Artifact):
    """A torch-side QAT model (the vendor's qat.pt): rebuilt from the spec + its state."""

    factory: str
    """The float model factory (``module:function``) the graph is rebuilt from."""
    example_shape: list[int]
    """Shape of the tracing input (the batch dimension is exported as dynamic)."""
    settings: dict[str, str | int | float | bool | dict]
    """Toolchain settings that change the arithmetic (policy, consistency level...)."""
    quant_state: Literal["float", "calibration", "validation", "qat"]
    """The quantizers' state when the model is loaded."""
    state_file: str
    """The safetensors state_dict of the prepared GraphModule (run-relative)."""
    metrics: list[Metric] = []
    """Dataset metrics measured by the stage that made it."""


class PreparedModel(QatModelArtifact):
    """prepare's output: fake quant inserted, BN folded, observers uncalibrated."""

    kind: Literal["prepared_model"] = "prepared_model"


class CalibratedModel(QatModelArtifact):
    """calibrate's output: every scale set from calibration data and frozen."""

    kind: Literal["calibrated_model"] = "calibrated_model"


class QatTunedModel(QatModelArtifact):
    """qat's output: fine-tuned for N steps, scales frozen afterwards."""

    kind: Literal["qat_tuned_model"] = "qat_tuned_model"


class QatExportModel(QatModelArtifact):
    """pre_export's output (the vendor's qat.export.pt): table ops in fixed point."""

    kind: Literal["qat_export_model"] = "qat_export_model"
    tables_file: str
    """tables.json (ops, attributes, scales); the arrays are in tables.safetensors beside it."""
    fixed_point: list[str] = []
    """Layer ids whose table op was made fixed point."""
    float_ops: dict[str, str] = {}
    """Table ops left in float, with the reason."""


class QatOnnxModel(Artifact):
    """export's output (the vendor's qat.bc): a QDQ ONNX graph of the deploy (eval) graph."""

    kind: Literal["qat_onnx"] = "qat_onnx"
    onnx_file: str
    """The ONNX file (run-relative)."""
    layer_ids: list[str]
    """Canonical ids of the layers in the graph, in topological order."""
    unmapped: dict[str, str] = {}
    """Layer ids of qat.export absent from the graph, with the reason (never dropped silently)."""
    backend: str
    """What runs it: onnxruntime, or the reference evaluator when custom ops are present."""
    metrics: list[Metric] = []
    """Dataset metrics of the graph."""


class QuantizedModel(Artifact):
    """convert's output (the vendor's quantized.bc): an integer ONNX graph."""

    kind: Literal["quantized_onnx"] = "quantized_onnx"
    onnx_file: str
    """The integer ONNX file (run-relative)."""
    layers_file: str
    """JSON: layer id -> integer tensor name, scale(s), dtype, channel axis."""
    settings: dict[str, str | int | float | bool]
    """The arithmetic: multiplier_bits, rounding, fuse_requantize."""
    float_ops: list[str] = []
    """Layer ids left as float islands (DequantizeLinear, float op, QuantizeLinear)."""
    folded_constants: list[str] = []
    """qat.onnx nodes computed on constants only, folded into initializers before convert."""
    warnings: list[str] = []
    """Advisor warnings (e.g. layers whose outputs mostly saturate)."""
    metrics: list[Metric] = []
    """Dataset metrics of the integer graph."""


class HbmModel(Artifact):
    """compile's output: the program for the simulated BPU (.hbm)."""

    kind: Literal["hbm"] = "hbm"
    hbm_file: str
    """The .hbm file (run-relative)."""
    march: str
    """The march it was compiled for."""
    instructions: int
    """Number of instructions."""
    board_file: str | None = None
    """board.hbm: the program with the board's camera input path in front (None when the
    runtime input is a featuremap)."""
    fused: list[list[str]] = []
    """Groups of layer ids one instruction covers (many-to-one)."""
    metrics: list[Metric] = []
    """Dataset metrics of the program on the simulated BPU (featuremap input)."""


class BoardRun(Artifact):
    """board_sim's output: the program run on the simulated board with its own input."""

    kind: Literal["board_run"] = "board_run"
    runtime_format: str
    """What the camera delivered (featuremap: the evaluation inputs as is)."""
    training_format: str
    """What the model was trained on."""
    metrics: list[Metric] = []
    """Dataset metrics on the board."""
