"""What every stage function gets besides its input artifact: the spec, the run, the data."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from schemas.fileio import sha256_bytes
from schemas.spec import PipelineSpec
from schemas.store import Run
from simulator.program.march import check_dtypes
from stages.convert.graph import ConvertSettings
from stages.data import Split, load_splits
from stages.data_check import check_with_model, forward_inputs
from stages.evaluate import collect
from stages.loader import import_object
from stages.modelio import build_float, model_digest, prepare_qat, source_digest
from stages.quantizer import QuantPolicy

# Consistency strategy levels (docs/design.md "Numerics"): what each level switches on.
# pot_*: power-of-two scales at prepare; the two flags are recorded for convert.
CONSISTENCY_LEVELS = {
    "none": {
        "pot_activations": False,
        "pot_weights": False,
        "high_precision_qpp": False,
        "fuse_requantize": True,
    },
    0: {
        "pot_activations": False,
        "pot_weights": False,
        "high_precision_qpp": True,
        "fuse_requantize": False,
    },
    1: {
        "pot_activations": True,
        "pot_weights": False,
        "high_precision_qpp": False,
        "fuse_requantize": True,
    },
    2: {
        "pot_activations": True,
        "pot_weights": True,
        "high_precision_qpp": False,
        "fuse_requantize": True,
    },
}


def level_settings(spec: PipelineSpec) -> dict:
    """The consistency level's switches with the spec's explicit overrides applied."""
    q = spec.quant
    out = dict(CONSISTENCY_LEVELS[q.consistency_level])
    for key in ("fuse_requantize", "high_precision_qpp"):
        if getattr(q, key) is not None:
            out[key] = getattr(q, key)
    return out


def policy_from_spec(spec: PipelineSpec) -> QuantPolicy:
    """The quantizer policy a spec asks for, consistency level applied, march checked."""
    q = spec.quant
    check_dtypes(q.march, q.weight_dtype, {q.activation_dtype, *q.overrides.values()})
    level = level_settings(spec)
    return QuantPolicy(
        activation_dtype=q.activation_dtype,
        overrides=dict(q.overrides),
        observer=q.observer,
        rounding=q.rounding,
        pot_activations=level["pot_activations"],
        pot_weights=level["pot_weights"],
        high_precision_output=q.high_precision_output,
        fuse_requantize=level["fuse_requantize"],
        percentile=q.percentile,
        averaging_constant=q.averaging_constant,
    )


def convert_settings(spec: PipelineSpec) -> ConvertSettings:
    """convert's arithmetic: multiplier width, requantize rounding, fusion."""
    level, cfg = level_settings(spec), spec.stages.convert
    bits = cfg.multiplier_bits or (32 if level["high_precision_qpp"] else 16)
    return ConvertSettings(
        multiplier_bits=bits,
        rounding=cfg.rounding or spec.quant.rounding,
        fuse_requantize=level["fuse_requantize"],
    )


def toolchain_settings(spec: PipelineSpec) -> dict:
    """Settings that change the arithmetic, as recorded in the run and its artifacts."""
    return {
        **asdict(policy_from_spec(spec)),
        **level_settings(spec),
        **asdict(convert_settings(spec)),
        "march": spec.quant.march,
        "consistency_level": str(spec.quant.consistency_level),
    }


@dataclass
class RunContext:
    """A stage's view of the run: spec, run folder, datasets (loaded once, lazily)."""

    spec: PipelineSpec
    run: Run
    code_version: str
    versions: dict[str, str] = field(default_factory=dict)
    recompute: frozenset[str] = frozenset()
    """Stages computed even when the cache holds their artifact (``qparity rerun``)."""

    @cached_property
    def splits(self) -> dict[str, Split]:
        """calibration, evaluation and train splits (see stages.data.load_splits), checked
        against the float model (stages.data_check) before any stage uses them; a large
        split is file-backed in the run's folder (an unlinked file: nothing is left)."""
        d, model = self.spec.data, self.float_model
        names = forward_inputs(model)
        folder = self.run.root if self.run is not None else None  # a check without a run
        splits = load_splits(d.dataset, d.calibration_samples, d.evaluation_samples, names, folder)
        check_with_model(splits, model, self.spec.compare.output)
        return splits

    @property
    def calibration(self) -> Split:
        return self.splits["calibration"]

    @property
    def evaluation(self) -> Split:
        return self.splits["evaluation"]

    @cached_property
    def float_model(self) -> torch.nn.Module:
        """The spec's float model (factory + kwargs + weights), built once per run."""
        m = self.spec.model
        return build_float(m.factory, m.weights, m.kwargs)

    @cached_property
    def reference(self) -> dict[str, np.ndarray]:
        """The float model's outputs on the evaluation split, by output id: what every
        stage's agreement metrics are measured against (stages.evaluate)."""
        ev, batch = self.evaluation, self.spec.data.batch_size
        return collect(self.float_model, ev, batch, "float", nhwc=True)

    @cached_property
    def task_metric(self) -> Callable | None:
        """The spec's ``data.metric`` function, imported (None: no task metric)."""
        ref = self.spec.data.metric
        return import_object(ref, field="data.metric") if ref else None

    @cached_property
    def task_metric_digest(self) -> str | None:
        """Digest of the source file of ``data.metric``'s module (None: no task metric):
        every stage records the metric, so an edited metric must not reuse cached ones."""
        return source_digest(self.task_metric) if self.task_metric else None

    @cached_property
    def float_digest(self) -> str:
        """Digest of the float model: its weights, the factory's arguments and the source
        of its factory module and module classes (stages.modelio.model_digest)."""
        m = self.spec.model
        return model_digest(self.float_model, m.factory, m.kwargs)

    def data_digest(self, name: str) -> str:
        """Digest of one input of a stage: a data split or the float model."""
        if name == "float_model":
            return self.float_digest
        return self.splits[name].digest if name in self.splits else sha256_bytes(b"absent")

    @cached_property
    def example(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Two evaluation samples: the tracing input (batch is exported as dynamic); a
        tuple, one tensor per input, for a model with several inputs."""
        n = min(2, len(self.evaluation))
        xs = tuple(t.clone() for t in self.evaluation.tensors(0, n))
        return xs[0] if len(xs) == 1 else xs

    @cached_property
    def policy(self) -> QuantPolicy:
        return policy_from_spec(self.spec)

    @cached_property
    def _qat_template(self) -> tuple[torch.fx.GraphModule, list, dict]:
        return prepare_qat(copy.deepcopy(self.float_model), self.example, self.policy)

    def prepared_qat(self) -> tuple[torch.fx.GraphModule, list, dict]:
        """The spec's QAT graph as prepare builds it (stages.modelio.prepare_qat): traced
        once per run, a fresh copy per call (every QAT-graph stage loads its own state into
        one; tracing costs seconds to minutes, a copy milliseconds)."""
        gm, infos, roles = self._qat_template
        with warnings.catch_warnings():  # torch's own pytree copy, not the user's code
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return copy.deepcopy(gm), list(infos), dict(roles)

    def artifact_dir(self, stage: str) -> Path:
        """The folder a stage writes its files to (created)."""
        path = self.run.path(f"artifacts/{stage}")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_debug(self, name: str, text: str) -> None:
        """Write a vendor-style text file into the run's debug folder (atomically)."""
        self.run.write_debug(name, text)
