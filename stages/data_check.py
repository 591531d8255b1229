"""The dataset against the model: input names, per-sample shapes and dtypes, labels.

stages.data checks what it can without a model; this module checks the rest before any
stage runs (RunContext.splits): every split's inputs have the evaluation split's
per-sample shape and dtype kind, the float model accepts the first evaluation samples, and
labels, when given, fit its judged output (stages.outputs): one class per sample in [0, C)
for an (N, C) output; an output that is not a tensor is refused.
Every error names the split, the input or the labels, and the sample.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from schemas.errors import StageError
from stages.data import Split
from stages.outputs import judged_output, output_arrays

_NAMED = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
          inspect.Parameter.KEYWORD_ONLY)  # fmt: skip


def forward_inputs(model: torch.nn.Module) -> list[str] | None:
    """The names of the model's forward parameters without a default, in order: the
    inputs the chain feeds (None: none named, e.g. ``*args`` or all optional: the
    dataset's names are taken as they are)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # a builtin or compiled forward: no signature
        return None
    names = [p.name for p in params if p.kind in _NAMED and p.default is p.empty]
    return names or None


def check_with_model(
    splits: dict[str, Split], model: torch.nn.Module, judged: str | None = None
) -> None:
    """Refuse data the model cannot take, an output that is not a tensor, or labels the
    judged output (``compare.output``, stages.outputs) cannot be scored against."""
    ref = splits["evaluation"]
    outs = _outputs(model, ref)  # first: a wrong evaluation input is named as such
    labelled = any(s.labels is not None for s in splits.values())
    out = outs[judged_output(outs, judged, labelled)]
    for split in splits.values():
        if split.name != "camera":
            _same_shapes(split, ref)
    for split in splits.values():
        if split.labels is not None:
            check_labels(split, out)


def _same_shapes(split: Split, ref: Split) -> None:
    """Each input of ``split`` has the evaluation split's per-sample shape and dtype kind."""
    for name, a in split.inputs.items():
        b = ref.inputs[name]
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            raise StageError(
                f"sample 0 of input '{name}' of split '{split.name}' is {a.dtype} "
                f"{a.shape[1:]}, the evaluation split's {b.dtype} {b.shape[1:]}",
                where=f"data.{split.name}.inputs.{name}[0]",
                hint="give every split the same per-sample shape and dtype",
            )


@torch.no_grad()
def _outputs(model: torch.nn.Module, ref: Split) -> dict[str, np.ndarray]:
    """The model's outputs on the first two evaluation samples by id; a refusal names the
    inputs."""
    feed = {k: torch.from_numpy(a[:2].copy()) for k, a in ref.inputs.items()}
    try:
        out = model(*feed.values())
    except Exception as e:  # whatever the model raises: shape, dtype, channel mismatch
        shapes = ", ".join(f"'{k}' {a.dtype} {tuple(a.shape[1:])}" for k, a in feed.items())
        raise StageError(
            f"the float model refused sample 0 of split 'evaluation' (input {shapes}): {e}",
            where=f"data.evaluation.inputs.{next(iter(feed))}[0]",
            hint="give each input the per-sample shape and dtype the model's forward takes",
        ) from e
    return output_arrays(out)


def check_labels(split: Split, out: np.ndarray) -> None:
    """Labels need an (N, C) output and every label in [0, C); names the first bad sample."""
    where = f"data.{split.name}.labels"
    if out.ndim != 2:
        raise StageError(
            f"split '{split.name}' has class labels, but the model's output is "
            f"{tuple(out.shape[1:])} per sample, not one score per class",
            where=where,
            hint="give labels None (stages are then judged by agreement with the float "
            "model) and score the task with data.metric: module:function",
        )
    classes = out.shape[1]
    bad = np.flatnonzero((split.labels < 0) | (split.labels >= classes))
    if bad.size:
        idx = int(bad[0])
        raise StageError(
            f"label {int(split.labels[idx])} of sample {idx} of split '{split.name}' is "
            f"outside [0, {classes}) (the model has {classes} outputs)",
            where=f"{where}[{idx}]",
            hint="labels count classes from 0, one per output of the model",
        )
