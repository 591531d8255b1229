"""Dataset-level judgement of a stage model, streamed over the evaluation split.

Every stage records, per model output (its canonical id, stages.outputs: ``output`` for a
single tensor, ``output.0``, ``output.boxes``...; ``f`` the float model's values, ``s`` the
stage's, over all evaluation samples together):

- cosine = <f, s> / (|f| |s|)
- sqnr_db = 10 log10(sum f^2 / sum (s - f)^2), at most 300 dB (identical outputs)
- l1 = mean |s - f|
- top1_agreement = share of samples whose arg-max equals the float model's ((N, C) outputs)
- top1 = share of samples whose arg-max equals the label (only when the dataset has labels;
  only on the judged output: ``compare.output``, else the first (N, C) one)

A task metric (``data.metric: module:function``: mAP, mIoU...) is called with the stage's
outputs, the float model's outputs and the labels (or None) and returns ``{name: float}``;
its rows carry no output id. ``compare.primary`` (:func:`primary_metric`) names the metric
localization, sweeps, ``show`` and the report judge by, on the judged output. Non-finite
output values read as 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np
import torch

from schemas.artifacts import Metric
from schemas.errors import StageError
from schemas.metric_names import LOWER_IS_BETTER, OUTPUT, primary_metric  # noqa: F401 (re-export)
from schemas.table_digests import remove_parts
from schemas.tables import float32_lists, write_columns
from simulator.runtime.threads import run_threads
from stages.data import Split
from stages.outputs import judged_output, output_arrays, positional
from stages.progress import tick

SQNR_CAP_DB = 300.0
"""SQNR of identical outputs (no noise): a finite number, so artifacts stay valid JSON."""


@torch.no_grad()
def collect(
    model: Callable,
    split: Split,
    batch_size: int,
    task: str,
    ids: list[str] | None = None,
    nhwc: bool = False,
) -> dict[str, np.ndarray]:
    """Every output of ``model`` over ``split`` by output id (progress ticks per batch).
    ``ids``: the model is a graph returning its outputs as a list in pytree order (ONNX,
    the program), named by the float model's ``ids``; else a torch model (any structure).
    ``nhwc``: image batches in channels-last memory (:func:`channels_last`; float models
    only, a fake-quant graph in FLOAT state included: in any other state its rounding
    would flip on the changed float sums)."""
    parts: dict[str, list[np.ndarray]] = {}
    done = 0
    for start, x, _ in split.batches(batch_size):
        with _torch_threads(ids is None):
            out, nhwc = run_batch(model, split.tensors(start, start + len(x)), nhwc)
        got = output_arrays(out) if ids is None else positional(ids, out, task)
        for oid, value in got.items():
            parts.setdefault(oid, []).append(value)
        done += len(x)
        tick(task, done, len(split))
    return {oid: np.concatenate(values) for oid, values in parts.items()}


def run_batch(model: Callable, xs: tuple, nhwc: bool) -> tuple[object, bool]:
    """(``model``'s output, whether channels-last input stays on): a model that rejects
    channels-last memory (``x.view(n, -1)`` after a conv) runs on the NCHW batch, and so
    does every later batch."""
    if nhwc:
        try:
            return model(*(channels_last(t) for t in xs)), True
        except RuntimeError:
            pass
    return model(*xs), False


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """A 4-D float image batch in channels-last memory (the same NCHW values): torch's CPU
    convolutions then run oneDNN's NHWC kernels and hand the layout on to the next op.
    Measured on torchvision's ResNet-50, 16 frames at 224x224, 2 threads: 110-113 ms a
    frame against 151-155 ms with contiguous NCHW input; outputs differ by float
    rounding only (3.6e-5 at most). Not for the fake-quant graphs: there the changed
    sums flip roundings (0.25 on ResNet-50's logits in QAT state), and the CALIBRATION
    state ran slower (208 against 186-198 ms). In FLOAT state (prepare's model: the float
    model with BN folded) there is nothing to flip: 86-97 against 120-125 ms a frame on
    the same model, 2.4e-5 from the float model either way. Anything else is returned as
    it is."""
    if x.ndim != 4 or not x.is_floating_point():
        return x
    return x.contiguous(memory_format=torch.channels_last)


@contextlib.contextmanager
def _torch_threads(torch_model: bool):
    """A torch model's batch on one thread per core other processes leave free
    (:func:`simulator.runtime.threads.run_threads`; ``QPARITY_THREADS`` fixes it): with one
    core busy elsewhere, torch's second thread makes every parallel op wait for it."""
    if not torch_model:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(min(prev, run_threads()))
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _finite(a: np.ndarray) -> np.ndarray:
    """NaN and Inf read as 0 (as analysis.metrics does): the metrics stay finite numbers."""
    return np.where(np.isfinite(a), a, 0.0)


def agreement(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """cosine, sqnr_db, l1 (and top1_agreement for (N, C) outputs) of ``out`` against the
    float model's ``ref`` (module docstring; cosine 1 when both are all zero)."""
    f, s = (_finite(np.ravel(a).astype(np.float64)) for a in (ref, out))
    d2, ff, ss = float(np.dot(s - f, s - f)), float(np.dot(f, f)), float(np.dot(s, s))
    norm = math.sqrt(ff * ss)
    cosine = float(np.dot(f, s)) / norm if norm > 0 else float(ff == ss)
    sqnr = SQNR_CAP_DB if d2 == 0 else 10 * math.log10(ff / d2) if ff > 0 else -SQNR_CAP_DB
    got = {
        "cosine": min(max(cosine, -1.0), 1.0),
        "sqnr_db": min(sqnr, SQNR_CAP_DB),
        "l1": float(np.abs(s - f).mean()) if f.size else 0.0,
    }
    if ref.ndim == 2:
        got["top1_agreement"] = float((out.argmax(1) == ref.argmax(1)).mean())
    return got


def measure(
    stage: str,
    outputs: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    labels: np.ndarray | None,
    task: Callable | None = None,
    judged: str | None = None,
) -> list[Metric]:
    """The metrics of one stage's ``outputs`` (module docstring; ``judged``: the output
    labels apply to, default the first (N, C) one)."""
    n = len(next(iter(reference.values())))
    judged = judged_output(reference, judged, labels is not None)
    rows = []
    for oid, out in outputs.items():
        values = agreement(out, reference[oid])
        if labels is not None and oid == judged and out.ndim == 2:
            values = {"top1": float((out.argmax(1) == labels).mean()), **values}
        rows += [Metric(stage=stage, metric=k, value=v, n_samples=n, output=oid)
                 for k, v in values.items()]  # fmt: skip
    if task is not None:
        rows += [Metric(stage=stage, metric=k, value=v, n_samples=n)
                 for k, v in task_values(task, outputs, reference, labels).items()]  # fmt: skip
    return rows


def task_values(task: Callable, outputs: dict, reference: dict, labels) -> dict[str, float]:
    """Call the task metric (one output: arrays, else dicts by output id); check its result."""
    single = list(outputs) == [OUTPUT]
    args = (outputs[OUTPUT], reference[OUTPUT]) if single else (outputs, reference)
    try:
        got = task(*args, labels)
    except Exception as e:  # user code
        raise StageError(
            f"the task metric raised {type(e).__name__}: {e}",
            where="data.metric",
            hint="call it on the float model's outputs on its own to debug it",
        ) from e
    ok = isinstance(got, dict) and all(
        isinstance(k, str) and isinstance(v, int | float) and math.isfinite(v)
        for k, v in got.items()
    )
    if not ok or not got:
        raise StageError(
            f"the task metric returned {str(got)[:80]}",
            where="data.metric",
            hint="return a non-empty {name: finite float} dict",
        )
    return {k: float(v) for k, v in got.items()}


def judge(
    stage: str, outputs: dict, reference: dict, labels, task: Callable | None, compare
) -> list[Metric]:
    """:func:`measure` with the task metric ``task`` and ``compare``'s judged output; the
    primary metric (``compare.primary``) must be among the results. Both chains' stages
    record their metrics through this."""
    rows = measure(stage, outputs, reference, labels, task, compare.output)
    primary_metric(compare.primary, {m.metric for m in rows})
    return rows


def stage_metrics(
    ctx,
    stage: str,
    model: Callable,
    split: Split | None = None,
    graph: bool = False,
    nhwc: bool = False,
) -> list[Metric]:
    """Run ``model`` over the evaluation split (or ``split``: the same samples as the
    board's camera sees them) and measure it against the float model (``ctx``: a
    RunContext); ``graph``: the model returns its outputs as a list; ``nhwc``: a float
    model, fed channels-last (see :func:`collect`)."""
    split = split or ctx.evaluation
    ids = list(ctx.reference) if graph else None
    outputs = collect(model, split, ctx.spec.data.batch_size, stage, ids, nhwc)
    record_outputs(ctx.run, stage, outputs)
    labels = ctx.evaluation.labels
    return judge(stage, outputs, ctx.reference, labels, ctx.task_metric, ctx.spec.compare)


OUTPUTS_LIMIT = 256 * 2**20
"""Bytes of outputs (all samples, float32) a stage writes to ``stage_outputs``; beyond
this (dense segmentation maps of many frames) the analysis reruns the stage model."""


def record_outputs(run, stage: str, outputs: dict[str, np.ndarray]) -> None:
    """Write a stage model's outputs on every evaluation sample to the ``stage_outputs``
    table (part ``<stage>/all``: a rerun of the stage replaces it), within :data:`OUTPUTS_LIMIT`;
    beyond it, an earlier part of the stage is removed (it would be stale)."""
    remove_parts(run, f"tables/stage_outputs/{stage}")
    if sum(4 * v.size for v in outputs.values()) > OUTPUTS_LIMIT:
        return
    cols: dict[str, list] = {"run_id": [], "stage": [], "output_id": [], "sample_id": []}
    tensors = []
    for oid, values in outputs.items():
        n = len(values)
        cols["run_id"] += [run.run_id] * n
        cols["stage"] += [stage] * n
        cols["output_id"] += [oid] * n
        cols["sample_id"] += list(range(n))
        tensors += list(values.reshape(n, -1))
    write_columns(run, "stage_outputs", {**cols, "values": float32_lists(tensors)}, f"{stage}/all")
