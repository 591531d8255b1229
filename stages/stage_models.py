"""Every stage's model, runnable on the same evaluation samples, capturing layers by id.

``open_stage_model(ctx, stage)`` loads the stage's artifact from the run and returns a
:class:`StageModel`: ``run(idx)`` feeds the evaluation samples ``idx`` (board_sim: the same
samples as camera frames) and returns ``(output, {layer id: tensor})`` in the common
layout of docs/design.md "Contracts": NCHW, float values (integer stages dequantized,
``x_float = q * scale`` per channel along the layer's axis). ``run(idx, replace=...)``
substitutes given layer tensors (same layout) while running, for sensitivity analysis.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from schemas.artifacts import Artifact, QuantizedModel
from schemas.errors import StageError
from stages import resident
from stages.context import RunContext

Captured = tuple[np.ndarray, dict[str, np.ndarray]]


@dataclass
class StageModel:
    """A stage's model behind one interface (see the module docstring)."""

    stage: str
    runner: Callable[[np.ndarray, dict[str, np.ndarray] | None], Captured]
    scales: dict[str, float] = field(default_factory=dict)
    """Layer id -> its output quantization step (largest over channels), where known."""
    substitutable: bool = True
    feedable: bool = False
    """Not substitutable, but ``replace`` may give its ``input:*`` values (a program fed
    featuremaps): run on another stage's input, it shows only the error it adds."""
    forget: Callable[[], None] = lambda: None
    """Drops what runs with ``replace`` built and kept (a graph runner's cut graphs)."""
    outputs_only: Callable[[np.ndarray, dict[str, np.ndarray] | None], np.ndarray] | None = None
    """The runner without captures (the compared output only), where the model has one."""

    def run(self, idx: np.ndarray, replace: dict[str, np.ndarray] | None = None) -> Captured:
        resident.release()  # what the previous runs freed (stages.resident)
        return self.runner(np.asarray(idx), replace)

    def output(self, idx: np.ndarray, replace: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """The compared output of :meth:`run`, without keeping (or dequantizing) every layer
        when the model can skip them: sensitivity's reverted runs read nothing else."""
        if self.outputs_only is None:
            return self.run(idx, replace)[0]
        resident.release()
        return self.outputs_only(np.asarray(idx), replace)


def open_stage_model(ctx: RunContext, stage: str) -> StageModel:
    """The stage model of ``stage`` in ``ctx.run`` (its artifact must be complete)."""
    from stages import stage_runners  # the per-kind loaders (torch, onnx, integer, hbm)

    art = load_stage_artifact(ctx, stage)
    loader = stage_runners.LOADERS.get(stage)
    if loader is None:
        raise StageError(
            f"stage {stage} has no model to compare",
            where="compare",
            hint=f"compare one of: {', '.join(stage_runners.LOADERS)}",
        )
    return loader(ctx, art)


def load_stage_artifact(ctx: RunContext, stage: str) -> Artifact:
    """The verified artifact a stage wrote in this run."""
    from stages.registry import get

    return ctx.run.load_artifact(stage, get(stage).output)


def integer_layers(ctx: RunContext, required: bool = True) -> dict[str, dict]:
    """convert's layers.json: layer id -> tensor name, scale list, dtype, axis (empty when
    convert has not run and the layers are not ``required``)."""
    rec = ctx.run.manifest().stages.get("convert")
    if not required and (rec is None or rec.status != "complete"):
        return {}
    art = ctx.run.load_artifact("convert", QuantizedModel)
    return json.loads(ctx.run.path(art.layers_file).read_text())


def _scale(info: dict, ndim: int) -> np.ndarray:
    """A layer's scale, shaped to broadcast along its channel axis (default 1, NCHW)."""
    scale = np.asarray(info["scale"], dtype=np.float64)
    if scale.size > 1:
        shape = [1] * ndim
        shape[info["axis"] if info["axis"] is not None else 1] = -1
        scale = scale.reshape(shape)
    return scale


def dequantize(q: np.ndarray, info: dict) -> np.ndarray:
    """x = q * scale, per channel along ``info['axis']`` (NCHW: channels on axis 1)."""
    q = np.asarray(q)
    return (q.astype(np.float64) * _scale(info, q.ndim)).astype(np.float32)


def quantize_like(x: np.ndarray, info: dict) -> np.ndarray:
    """The integers of float ``x`` at a layer's scale (round half to even, saturated):
    ``q = clamp(round_half_even(x / scale), qmin, qmax)``."""
    from simulator.arith import fixedpoint as fp

    x = np.asarray(x, dtype=np.float64)
    q = fp.round_by(x / _scale(info, x.ndim), "half_even")
    lo, hi = fp.qrange(info["dtype"])
    return np.clip(q, lo, hi).astype(np.dtype(info["dtype"]))


def as_torch_input(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))
