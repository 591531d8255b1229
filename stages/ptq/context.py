"""What every PTQ stage gets: the run, the model name, the quant config, the data; and the
artifact every PTQ stage hands to the next."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from schemas.artifacts import Artifact, Metric
from schemas.spec_sections import CompareSpec
from schemas.store import Run
from simulator.program.march import March
from stages.data import Split
from stages.evaluate import collect, judge
from stages.loader import import_object
from stages.modelio import source_digest
from stages.onnx_runner import OnnxRunner
from stages.ptq import feeds
from stages.ptq.calibrate_onnx import QuantConfig

VENDOR_FILES = {
    "original": "{name}_original_float_model.onnx",
    "optimized": "{name}_optimized_float_model.onnx",
    "calibrated": "{name}_calibrated_model.onnx",
    "ptq": "{name}_ptq_model.onnx",
    "quantized": "{name}_quantized_model.onnx",
    "hbm": "{name}.hbm",
}
"""The vendor's artifact file names (its PTQ guide's); ``board`` writes none."""


class PtqModel(Artifact):
    """One PTQ stage's model (or board run): its file, layer table and findings."""

    kind: Literal["ptq_model"] = "ptq_model"
    onnx_file: str | None = None
    """The stage's ONNX model (run-relative); None for hbm and board."""
    hbm_file: str | None = None
    """The .hbm program (hbm stage; carried on by board)."""
    layers_file: str | None = None
    """quantized: layer id -> integer tensor, scale(s), dtype, axis (as convert writes it)."""
    removed: dict[str, str] = {}
    """optimized: layer ids folded or removed, with what happened to each."""
    fixed_point: list[str] = []
    """ptq: layer ids whose table op became a lookup table."""
    float_ops: dict[str, str] = {}
    """Layer ids left in float, with the reason."""
    metrics: list[Metric] = []
    """Dataset metrics of the stage's model."""


@dataclass
class PtqContext:
    """The run and everything the stages read besides their input artifact."""

    run: Run
    name: str
    source: Path
    quant: QuantConfig
    march: March
    splits: dict[str, Split]
    batch_size: int = 100
    probe_samples: int = 4
    cosine: float = 0.999
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    """model.input_shapes: input name -> dims fixed at ``original``."""
    compare: CompareSpec = field(default_factory=CompareSpec)
    """The judged output (compare.output: labels, top1 and the primary metric apply to it;
    null: stages.outputs' rule) and the primary metric (compare.primary)."""
    metric: str | None = None
    """data.metric: 'module:function' of the task metric every stage records (null: none)."""

    def file(self, stage: str) -> str:
        """Run-relative path of the stage's vendor-named file."""
        return f"artifacts/{stage}/{VENDOR_FILES[stage].format(name=self.name)}"

    def write_debug(self, name: str, text: str) -> None:
        self.run.write_debug(name, text)

    def append_check(self, lines: list[str]) -> None:
        """Add a section to debug/model_check_result.txt (the original stage starts it)."""
        path = self.run.path("debug/model_check_result.txt")
        old = path.read_text() if path.is_file() else ""
        self.write_debug("model_check_result.txt", old + "\n".join(lines) + "\n")

    @property
    def evaluation(self) -> Split:
        return self.splits["evaluation"]

    @property
    def calibration(self) -> Split:
        return self.splits["calibration"]

    @cached_property
    def output_ids(self) -> list[str]:
        """The original model's outputs by canonical id, in graph order (stages.ptq.feeds)."""
        return feeds.output_ids(onnx.load(str(self.run.path(self.file("original")))))

    def _outputs(self, stage: str, fn) -> dict[str, np.ndarray]:
        names = list(self.evaluation.inputs)
        model = lambda *ts: fn(dict(zip(names, (t.numpy() for t in ts), strict=True)))  # noqa: E731
        ids = self.output_ids
        return collect(model, self.evaluation, self.batch_size, f"{stage} metrics", ids)

    @cached_property
    def reference(self) -> dict[str, np.ndarray]:
        """The original float model's outputs on the evaluation split (what every stage's
        agreement is measured against)."""
        runner = OnnxRunner(self.run.path(self.file("original")))
        return self._outputs("original", runner.run)

    @cached_property
    def task_metric(self) -> Callable | None:
        """The ``data.metric`` function, imported (None: no task metric)."""
        return import_object(self.metric, field="data.metric") if self.metric else None

    @cached_property
    def task_metric_digest(self) -> str | None:
        """Digest of the task metric's module source (None: none): every stage records the
        metric, so an edited one must not reuse cached stages."""
        return source_digest(self.task_metric) if self.task_metric else None

    def measure(self, stage: str, fn) -> list[Metric]:
        """The metrics of ``fn`` ({input name: numpy batch} -> the outputs in graph order)
        on the evaluation split, as the QAT chain's stages record them
        (:func:`stages.evaluate.judge`): per output, agreement with the original model, top1
        with labels on the judged output; the task metric's rows."""
        outputs = self._outputs(stage, fn)
        labels = self.evaluation.labels
        return judge(stage, outputs, self.reference, labels, self.task_metric, self.compare)
