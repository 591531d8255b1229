"""Datasets as stages see them: validated numpy splits, streamed in batches.

A dataset is a ``module:function`` returning ``{"train": split, "evaluation": split}``
(optionally a separate ``"calibration"`` split, and ``"camera_evaluation"``: the evaluation
samples as uint8 RGB camera frames, for board_sim's input path). A split is either

- ``{"inputs": {name: array, ...}, "labels": array | None}``: the names are the model's
  forward parameters, the arrays of any numeric dtype (float inputs become float32, integer
  and bool inputs int64), N samples each; or
- ``(x, y)``: the same with one input, named after the model's (single) forward parameter.

Labels are optional: integers of shape (N,), one class per sample (checked against the
model's output by stages.data_check). Without labels every stage is judged by its agreement
with the float model (stages.evaluate). Calibration uses the first ``calibration_samples``
of "calibration" (else "train"), evaluation the first ``evaluation_samples`` of
"evaluation". Every batch is checked for NaN/Inf before a model sees it, and every error
names the split, the input and the sample.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from schemas.errors import StageError
from stages import resident
from stages.loader import import_object

SPLIT_FORMS = '{"inputs": {name: array}, "labels": array or None}, or (x, y)'
FILE_BACKED_BYTES = 64 * 2**20
"""A split whose inputs pass this many bytes is held in a file mapping
(stages.resident.file_backed): 1000 frames of 3x224x224 float32 are 0.6 GB, and a run
reads them a batch at a time."""
DIGEST_BYTES = 64 * 2**20
""":attr:`Split.digest` hashes a split this many bytes at a time, dropping a file-backed
split's pages between them: hashed whole, MobileNetV2@224's 1000 frames mapped 0.6 GB at
once, the run's peak (bench/README.md, "The dataset's own peak")."""


@dataclass(frozen=True)
class Split:
    """One split of a dataset: named inputs (in the model's parameter order), N samples
    each, and N integer labels or None."""

    name: str
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.x)

    @property
    def x(self) -> np.ndarray:
        """The first (for one-input models: the) input."""
        return next(iter(self.inputs.values()))

    @property
    def y(self) -> np.ndarray | None:
        """The labels (None: the dataset has none)."""
        return self.labels

    @property
    def digest(self) -> str:
        """sha256 of the inputs and labels, so cache keys follow the data."""
        h = hashlib.sha256()
        arrays = [*self.inputs.values(), *([] if self.labels is None else [self.labels])]
        for a in arrays:
            h.update(str((a.dtype, a.shape)).encode())
            a = np.ascontiguousarray(a)
            step = max(1, DIGEST_BYTES // max(1, a[:1].nbytes))
            for start in range(0, len(a), step):  # the bytes in order: one hash of the buffer
                h.update(a[start : start + step].data)  # the buffer itself, not a bytes copy
                resident.drop_mapped()  # a file-backed split's pages read so far
        return h.hexdigest()

    def batches(self, batch_size: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
        """Yield (first sample index, x, y or None) batches; refuses NaN/Inf naming the
        input and the sample."""
        for start in range(0, len(self), batch_size):
            resident.drop_mapped()  # the batches before this one (file-backed splits)
            for input_name, a in self.inputs.items():
                self._check_finite(input_name, a[start : start + batch_size], start)
            y = None if self.labels is None else self.labels[start : start + batch_size]
            x = self.x[start : start + batch_size]
            yield start, torch.from_numpy(x), None if y is None else torch.from_numpy(y)

    def arrays(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
        """Every input's samples ``start:stop``, in the model's parameter order."""
        return tuple(a[start:stop] for a in self.inputs.values())

    def tensors(self, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        """Every input's samples ``start:stop``, in the model's parameter order."""
        return tuple(torch.from_numpy(a[start:stop]) for a in self.inputs.values())

    def take(self, indices) -> tuple[torch.Tensor, ...]:
        """Every input's samples at ``indices`` (e.g. the probe frames), in parameter order."""
        return tuple(
            torch.from_numpy(np.ascontiguousarray(a[indices])) for a in self.inputs.values()
        )

    def _check_finite(self, input_name: str, x: np.ndarray, start: int) -> None:
        if not np.issubdtype(x.dtype, np.floating):
            return
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if bad.any():
            idx = start + int(np.flatnonzero(bad)[0])
            raise StageError(
                f"sample {idx} of the {self.name} split contains NaN or Inf (input '{input_name}')",
                where=f"data.{self.name}[{idx}]",
                hint="clean or drop that sample in the dataset function",
            )


def load_splits(
    dataset: str,
    calibration_samples: int,
    evaluation_samples: int,
    input_names: list[str] | None = None,
    folder: Path | None = None,
) -> dict[str, Split]:
    """The calibration, evaluation and train splits of a dataset function, checked.

    ``input_names`` are the model's forward parameters (null: the names the dataset gives,
    ``x`` for the (x, y) form). Calibration and evaluation are cut to the spec's sample
    counts; train (used by QAT fine-tuning) is the dataset's whole calibration/train split.
    A split of more than :data:`FILE_BACKED_BYTES` is held in a file mapping in ``folder``
    (default: the temporary folder), the same values.
    """
    data = import_object(dataset, field="data.dataset")()
    if not isinstance(data, dict) or "evaluation" not in data:
        raise StageError(
            f"{dataset} returned {type(data).__name__}",
            where="data.dataset",
            hint=f'return {{"train": split, "evaluation": split}}, each split {SPLIT_FORMS}',
        )
    calib_key = "calibration" if "calibration" in data else "train"
    if calib_key not in data:
        raise StageError(
            f"{dataset} has no 'train' or 'calibration' split",
            where="data.dataset",
            hint="add a 'train' split for calibration",
        )
    names = input_names or None
    train = _split("train", data.get("train", data[calib_key]), None, names)
    splits = {
        "calibration": _split(calib_key, data[calib_key], calibration_samples, names),
        "evaluation": _split("evaluation", data["evaluation"], evaluation_samples, names),
        "train": train,
    }
    if "camera_evaluation" in data:
        splits["camera"] = _camera(data["camera_evaluation"], splits["evaluation"])
    del data, train  # the dataset's own arrays go with the in-memory splits, once file-backed:
    splits = {k: _file_backed(v, folder) for k, v in splits.items()}
    resident.settle()  # then the heap gives back them and what building them left free
    return splits


def _file_backed(split: Split, folder: Path | None) -> Split:
    """``split`` with its inputs in file mappings if they pass :data:`FILE_BACKED_BYTES`."""
    if sum(a.nbytes for a in split.inputs.values()) <= FILE_BACKED_BYTES:
        return split
    inputs = {k: resident.file_backed(a, folder) for k, a in split.inputs.items()}
    return Split(split.name, inputs, split.labels)


def _camera(frames, evaluation: Split) -> Split:
    """The evaluation samples as the board's camera sees them (uint8 RGB N x H x W x 3)."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise StageError(
            f"camera_evaluation is {frames.dtype} {frames.shape}",
            where="data.camera_evaluation",
            hint="uint8 RGB frames N x H x W x 3",
        )
    if len(frames) < len(evaluation):
        raise StageError(
            f"{len(frames)} camera frames for {len(evaluation)} samples",
            where="data.camera_evaluation",
            hint="one frame per evaluation sample",
        )
    frames = np.ascontiguousarray(frames[: len(evaluation)])
    return Split("camera", {"camera": frames}, evaluation.labels)


def _split(name: str, value, n: int | None, names: list[str] | None) -> Split:
    """One split of either form, validated and cut to ``n`` samples (None: all)."""
    raw, labels = _unpack(name, value, names)
    inputs = _named(name, raw, names)
    arrays = {k: _input_array(name, k, v) for k, v in inputs.items()}
    first = next(iter(arrays))
    size = len(arrays[first])
    if size == 0:
        raise StageError(
            f"split '{name}' is empty",
            where=f"data.{name}",
            hint="the dataset function must return at least one sample",
        )
    for k, a in arrays.items():
        if len(a) != size:
            raise StageError(
                f"split '{name}' has {size} samples of input '{first}' but {len(a)} of '{k}'",
                where=f"data.{name}.inputs.{k}",
                hint="every input needs one entry per sample",
            )
    y = None if labels is None else _labels(name, labels, size)
    n = size if n is None else n
    if size < n:
        raise StageError(
            f"split '{name}' has {size} samples, the spec asks for {n}",
            where=f"data.{name}",
            hint="lower the sample count in the spec",
        )
    cut = {k: np.ascontiguousarray(a[:n]) for k, a in arrays.items()}
    return Split(name, cut, None if y is None else y[:n])


def _unpack(name: str, value, names: list[str] | None) -> tuple[dict | object, object]:
    """(inputs as given, labels or None) of a split of either form."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"inputs", "labels"})
        if "inputs" not in value or unknown or not isinstance(value["inputs"], dict):
            raise StageError(
                f"split '{name}' has keys {sorted(value)}"
                + (f" ({unknown[0]!r} is not one)" if unknown else ""),
                where=f"data.{name}",
                hint=f"a split is {SPLIT_FORMS}",
            )
        return value["inputs"], value.get("labels")
    try:
        x, y = value
    except (TypeError, ValueError) as e:
        raise StageError(
            f"split '{name}' is not an (inputs, labels) pair",
            where=f"data.{name}",
            hint=f"a split is {SPLIT_FORMS}",
        ) from e
    return {(names or ["x"])[0]: x}, y


def _named(name: str, inputs: dict, names: list[str] | None) -> dict:
    """The inputs in the model's parameter order; a missing or unknown name is an error."""
    if not inputs:
        raise StageError(
            f"split '{name}' has no inputs", where=f"data.{name}.inputs", hint=SPLIT_FORMS
        )
    if names is None:
        return dict(inputs)
    missing = [k for k in names if k not in inputs]
    unknown = [k for k in inputs if k not in names]
    if missing or unknown:
        what = f"no input '{missing[0]}'" if missing else f"an input '{unknown[0]}'"
        raise StageError(
            f"split '{name}' has {what}; the model's forward takes {', '.join(names)}",
            where=f"data.{name}.inputs",
            hint="name the inputs after the model's forward parameters",
        )
    return {k: inputs[k] for k in names}


def _input_array(split: str, name: str, value) -> np.ndarray:
    """One input as an array: numeric, at least one sample dimension, float32 or int64."""
    where = f"data.{split}.inputs.{name}"
    try:
        a = np.asarray(value)
    except ValueError as e:  # samples of different shapes
        raise _ragged(split, name, value, where) from e
    if a.dtype == object:
        raise _ragged(split, name, value, where)
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool) or np.iscomplexobj(a):
        raise StageError(
            f"input '{name}' of split '{split}' is {a.dtype}, not numeric",
            where=where,
            hint="give float, integer or bool arrays",
        )
    if a.ndim == 0:
        raise StageError(
            f"input '{name}' of split '{split}' is a scalar",
            where=where,
            hint="the first dimension counts the samples",
        )
    dtype = np.float32 if np.issubdtype(a.dtype, np.floating) else np.int64
    return a.astype(dtype, copy=False)  # the dataset's float32 array itself, not a 2nd copy


def _ragged(split: str, name: str, value, where: str) -> StageError:
    """The error for samples of different shapes (or non-numeric objects), naming one."""
    shapes = [np.shape(v) for v in value] if isinstance(value, list | tuple) else []
    idx = next((i for i, s in enumerate(shapes) if s != shapes[0]), None)
    what = (
        f"sample {idx} of input '{name}' of split '{split}' has shape {shapes[idx]}, "
        f"sample 0 {shapes[0]}"
        if idx is not None
        else f"input '{name}' of split '{split}' is not a numeric array"
    )
    at = where if idx is None else f"{where}[{idx}]"
    return StageError(what, where=at, hint="every sample of an input needs the same shape")


def _labels(name: str, value, size: int) -> np.ndarray:
    """Labels: integers, one per sample (shape (N,): an (N, 1) column would broadcast)."""
    y = np.asarray(value)
    where = f"data.{name}.labels"
    if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
        raise StageError(
            f"split '{name}' has labels {y.dtype} of shape {y.shape}",
            where=where,
            hint="give integer labels, one per sample (shape (N,)), or labels None",
        )
    if len(y) != size:
        raise StageError(
            f"split '{name}' has {size} inputs but {len(y)} labels",
            where=where,
            hint="inputs and labels must pair up",
        )
    return y.astype(np.int64)
