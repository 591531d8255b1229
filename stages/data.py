"""Datasets as stages see them: validated numpy splits, streamed in batches.

A dataset is a ``module:function`` returning ``{"train": (x, y), "evaluation": (x, y)}``
(optionally a separate ``"calibration"`` split, and ``"camera_evaluation"``: the evaluation
samples as uint8 RGB camera frames, for board_sim's input path): x float32 N x ..., y int
labels of shape (N,). Calibration uses the first ``calibration_samples`` of "calibration" (else "train"), evaluation the first
``evaluation_samples`` of "evaluation". Every batch is checked for NaN/Inf before a model
sees it, and the error names the split and the sample index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from schemas.errors import StageError
from stages.loader import import_object


@dataclass(frozen=True)
class Split:
    """One split of a dataset: inputs and integer labels of the same length."""

    name: str
    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.x)

    @property
    def digest(self) -> str:
        """sha256 of the inputs and labels, so cache keys follow the data."""
        h = hashlib.sha256()
        for a in (self.x, self.y):
            h.update(str((a.dtype, a.shape)).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def batches(self, batch_size: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """Yield (first sample index, x, y) batches; refuses NaN/Inf naming the sample."""
        for start in range(0, len(self), batch_size):
            x = self.x[start : start + batch_size]
            bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
            if bad.any():
                idx = start + int(np.flatnonzero(bad)[0])
                raise StageError(
                    f"sample {idx} of the {self.name} split contains NaN or Inf",
                    where=f"data.{self.name}[{idx}]",
                    hint="clean or drop that sample in the dataset function",
                )
            yield start, torch.from_numpy(x), torch.from_numpy(self.y[start : start + batch_size])


def load_splits(
    dataset: str, calibration_samples: int, evaluation_samples: int
) -> dict[str, Split]:
    """The calibration, evaluation and train splits of a dataset function, checked.

    Calibration and evaluation are cut to the spec's sample counts; train (used by QAT
    fine-tuning) is the dataset's whole calibration/train split.
    """
    data = import_object(dataset, field="data.dataset")()
    if not isinstance(data, dict) or "evaluation" not in data:
        raise StageError(
            f"{dataset} returned {type(data).__name__}",
            where="data.dataset",
            hint='return {"train": (x, y), "evaluation": (x, y)}',
        )
    calib_key = "calibration" if "calibration" in data else "train"
    if calib_key not in data:
        raise StageError(
            f"{dataset} has no 'train' or 'calibration' split",
            where="data.dataset",
            hint="add a 'train' split for calibration",
        )
    train_pair = data.get("train", data[calib_key])
    splits = {
        "calibration": _split(calib_key, data[calib_key], calibration_samples),
        "evaluation": _split("evaluation", data["evaluation"], evaluation_samples),
        "train": _split("train", train_pair, len(train_pair[0])),
    }
    if "camera_evaluation" in data:
        splits["camera"] = _camera(data["camera_evaluation"], splits["evaluation"])
    return splits


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
    return Split("camera", np.ascontiguousarray(frames[: len(evaluation)]), evaluation.y)


def _split(name: str, pair, n: int) -> Split:
    try:
        x, y = pair
    except (TypeError, ValueError) as e:
        raise StageError(
            f"split '{name}' is not an (inputs, labels) pair",
            where=f"data.{name}",
            hint="return numpy arrays (x, y)",
        ) from e
    x, y = np.asarray(x), np.asarray(y)
    if len(x) == 0:
        raise StageError(
            f"split '{name}' is empty",
            where=f"data.{name}",
            hint="the dataset function must return at least one sample",
        )
    if len(x) != len(y):
        raise StageError(
            f"split '{name}' has {len(x)} inputs but {len(y)} labels",
            where=f"data.{name}",
            hint="inputs and labels must pair up",
        )
    integer_labels = np.issubdtype(y.dtype, np.integer) and y.ndim == 1
    if not np.issubdtype(x.dtype, np.floating) or not integer_labels:  # (N, 1) would broadcast
        raise StageError(
            f"split '{name}' has inputs {x.dtype} and labels {y.dtype} of shape {y.shape}",
            where=f"data.{name}",
            hint="use float inputs and integer labels, one per sample (shape (N,))",
        )
    if len(x) < n:
        raise StageError(
            f"split '{name}' has {len(x)} samples, the spec asks for {n}",
            where=f"data.{name}",
            hint="lower the sample count in the spec",
        )
    return Split(name, np.ascontiguousarray(x[:n], dtype=np.float32), y[:n].astype(np.int64))
