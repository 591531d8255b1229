"""Sensitivity measured by trying: calibrate's fake-quant model re-run on the probe frames
with an int16 override, as the vendor's sensitivity tool does.

A trial applies one ``quant.overrides`` entry ``{key: int16}`` (a module path: the layer and
every layer below it, as stages.quantizer.QuantPolicy.dtype_for matches) to the calibrated
model and measures its output against the float model's on the probe frames
(``compare.probe_samples``, not the whole evaluation split). The int16 scale is frozen
from the quantizer's stored calibration statistics: ``symmetric_scale(amax, int16)`` with
the observer's ``amax`` (minmax observers: exactly what calibrating with the override
gives), else the calibrated int8 range ``scale * 255 / 2`` (percentile and MSE observers:
the range they chose in int8 is kept, 256x finer steps). Nothing is re-calibrated, so a
trial costs one forward pass over the probe frames; at most ``MAX_TRIALS`` run.

The metric is the run's primary one where it is an agreement metric (top1 -> top-1
agreement with the float model, cosine, sqnr_db, l1), else the output cosine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from simulator.arith import fixedpoint
from stages.evaluate import LOWER_IS_BETTER, agreement
from stages.fake_quant import QAT_OBSERVERS, QFakeQuantize, QuantState, set_model_state
from stages.modelio import load_qat, name_quantizers
from stages.outputs import first_output
from stages.quantizer import QuantPolicy
from stages.stage_models import load_stage_artifact

MAX_TRIALS = 64
"""Most trials (one forward pass over the probe frames each) per analysis."""
LEAVE_OUT = "all flagged but "
"""Target prefix of a leave-one-out trial."""
METRICS = {"top1": "top1_agreement", "cosine": "cosine", "sqnr_db": "sqnr_db", "l1": "l1",
           "top1_agreement": "top1_agreement"}  # fmt: skip


@dataclass(frozen=True)
class Trial:
    """One override tried: output metric against the float model before and after."""

    target: str
    """The layer id of a single override, or a group's name (e.g. ``residual adds``)."""
    keys: tuple[str, ...]
    metric: str
    before: float
    after: float

    @property
    def gain(self) -> float:
        """How much the override restores (positive: better)."""
        return self.before - self.after if self.metric in LOWER_IS_BETTER else (
            self.after - self.before)  # fmt: skip


@dataclass
class TrialModel:
    """Calibrate's model, its quantizers by layer id, and the float output on the probes."""

    gm: torch.fx.GraphModule
    by_layer: dict[str, list[QFakeQuantize]]
    policy: QuantPolicy
    x: tuple[torch.Tensor, ...]
    reference: np.ndarray
    metric: str

    @property
    def scales(self) -> dict[str, float]:
        return {lid: float(fqs[0].scale.max()) for lid, fqs in self.by_layer.items()}

    @property
    def dtypes(self) -> dict[str, str]:
        return {lid: fqs[0].qdtype for lid, fqs in self.by_layer.items()}

    def measure(self) -> float:
        with torch.no_grad():
            out = first_output(self.gm(*self.x)).detach().numpy()
        return agreement(out, self.reference)[self.metric]


def trial_model(ctx, probes: np.ndarray, primary: str) -> TrialModel:
    """Calibrate's model of the run in VALIDATION state, fed the probe frames ``probes``."""
    gm = load_qat(load_stage_artifact(ctx, "calibrate"), ctx)
    set_model_state(gm, QuantState.VALIDATION)
    by_layer = output_quantizers(gm)
    x = ctx.evaluation.take(probes)
    with torch.no_grad():
        ref = first_output(ctx.float_model(*x)).detach().numpy()
    metric = METRICS.get(primary, "cosine")
    metric = metric if metric != "top1_agreement" or ref.ndim == 2 else "cosine"
    return TrialModel(gm, by_layer, ctx.policy, x, ref, metric)


def output_quantizers(gm: torch.fx.GraphModule) -> dict[str, list[QFakeQuantize]]:
    """Layer id -> its output quantizer(s) (what a ``quant.overrides`` entry changes)."""
    by_layer: dict[str, list[QFakeQuantize]] = {}
    for target, (lid, role) in name_quantizers(gm).items():
        if role == "output":
            by_layer.setdefault(lid, []).append(gm.get_submodule(target))
    return by_layer


def run_trials(
    tm: TrialModel, singles: list[str], groups: dict[str, list[str]], budget: int = MAX_TRIALS
) -> list[Trial]:
    """Each single override key, then each group's keys together (at most ``budget``
    trials; keys that change no int8 quantizer are skipped), best gain first."""
    before = tm.measure()
    todo = [(k, (k,)) for k in dict.fromkeys(singles)]
    todo += [(name, tuple(dict.fromkeys(keys))) for name, keys in groups.items() if keys]
    rows = []
    for target, keys in todo:
        changed = _changed(tm, keys)
        if not changed or len(rows) >= budget:
            continue
        with in_int16(changed):
            rows.append(Trial(target, keys, tm.metric, before, tm.measure()))
    return sorted(rows, key=lambda t: -t.gain)


def leave_one_out(tm: TrialModel, keys: list[str], budget: int) -> dict[str, Trial]:
    """For each key (at most ``budget``): every other key of ``keys`` in int16, it not.
    Layers that only help together (each int8 layer ruins what the others keep) show
    here: the loss of dropping one from the group is what the group needs it for."""
    groups = {f"{LEAVE_OUT}{k}": [o for o in keys if o != k] for k in keys[:budget]}
    return {t.target[len(LEAVE_OUT) :]: t for t in run_trials(tm, [], groups, budget)}


def _changed(tm: TrialModel, keys: tuple[str, ...]) -> list[QFakeQuantize]:
    """The int8 output quantizers the overrides ``keys`` make int16."""
    policy = dataclasses.replace(tm.policy, overrides={**tm.policy.overrides,
                                                       **dict.fromkeys(keys, "int16")})  # fmt: skip
    return [fq for lid, fqs in tm.by_layer.items() for fq in fqs
            if fq.qdtype == "int8" and policy.dtype_for(lid) == "int16"]  # fmt: skip


@contextmanager
def in_int16(fqs: list[QFakeQuantize]) -> Iterator[None]:
    """The quantizers ``fqs`` in int16 (scale from their calibration statistics, module
    docstring) for the duration; restored afterwards."""
    saved = [(fq, fq.qdtype, fq.dtype, fq.quant_min, fq.quant_max, fq.scale.clone()) for fq in fqs]
    try:
        for fq in fqs:
            _to_int16(fq)
        yield
    finally:
        for fq, qdtype, dtype, lo, hi, scale in saved:
            fq.qdtype, fq.dtype, fq.quant_min, fq.quant_max = qdtype, dtype, lo, hi
            fq.scale.resize_(scale.shape).copy_(scale)


def _to_int16(fq: QFakeQuantize) -> None:
    observer = fq._stats_observer()
    if fq.observer_kind in QAT_OBSERVERS and observer.has_data:
        amax = observer.amax()
    else:
        amax = fq.scale * (fq.quant_max - fq.quant_min) / 2
    scale = fixedpoint.symmetric_scale(amax, "int16")
    scale = fixedpoint.pot_scale(scale) if fq.pot else scale
    fq.qdtype, fq.dtype = "int16", torch.int16
    fq.quant_min, fq.quant_max = fixedpoint.qrange("int16")
    fq.scale.resize_(scale.shape).copy_(torch.as_tensor(scale, dtype=fq.scale.dtype))
