"""The zoo's datasets: image crops labelled by the float model's own top-1.

The zoo's weights are seeded, not trained, so there are no true labels: each image is
labelled with the float model's argmax, and a stage's top-1 is its *agreement* with the
float model (what the vendor's consistency checks measure). ``examples.zoo.data:<name>``
(or ``small_<name>``) is the dataset of ``examples.zoo.models:<name>``: 256 calibration
crops and :func:`evaluation_frames` evaluation crops (the spec's sample counts cut them).
Labels are computed once per model and split sizes, then read from :data:`CACHE_DIR`.
"""

from __future__ import annotations

import inspect
import os
import zipfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from examples.weights import source_key
from examples.zoo import images, libs, models
from examples.zoo.models import ZOO, build, entry_of
from schemas.fileio import atomic_writer
from stages.evaluate import channels_last, run_batch

CALIBRATION = 256


def calibration_frames() -> int:
    """Calibration crops made: ``$QPARITY_ZOO_CALIBRATION`` (bench/simulator.py sets it to the
    few frames it calibrates on, so a 224x224 ResNet-50 does not label 256), else
    :data:`CALIBRATION`."""
    return int(os.environ.get("QPARITY_ZOO_CALIBRATION", str(CALIBRATION)))


def evaluation_frames() -> int:
    """Evaluation crops made: ``$QPARITY_ZOO_FRAMES`` (bench/zoo.py sets it to its frame
    count, so 100-frame runs do not label 1000), else 1000."""
    return int(os.environ.get("QPARITY_ZOO_FRAMES", "1000"))


def dataset(name: str, size: int, frames: int) -> dict:
    """Calibration and evaluation crops of zoo model ``name`` at ``size``, labelled
    (segmentation models: no labels; judged by output agreement and :func:`miou`). The
    crops are made on every call (seeded: the same arrays) and not kept, so a run holds
    the one copy it reads (a large split is file-backed: stages.data.FILE_BACKED_BYTES)."""
    train = images.crops(calibration_frames(), size, seed=1)
    evaluation = images.crops(frames, size, seed=2)
    if ZOO[name].task == "segment":  # named as forward names it (torchvision's: ``input``)
        arg = next(iter(inspect.signature(build(name, size).forward).parameters))
        return {
            "train": {"inputs": {arg: train}, "labels": None},
            "evaluation": {"inputs": {arg: evaluation}, "labels": None},
        }
    train_y, evaluation_y = _labelled(name, size, train, evaluation)
    return {"train": (train, train_y), "evaluation": (evaluation, evaluation_y)}


_LABELS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
CACHE_DIR = Path(__file__).resolve().parent / ".cache"
"""Where :func:`_labelled` keeps the labels it computed (git ignores ``examples/**/.cache``)."""


def _labelled(name: str, size: int, train: np.ndarray, evaluation: np.ndarray) -> tuple:
    """The float model's top-1 of both splits, computed once per process, model and
    split sizes (the crops are seeded, so they are the same arrays), and kept in
    :data:`CACHE_DIR` for the next process (the file name holds the split sizes and
    :func:`labels_key`): ResNet-50's 64 + 1000 crops at 224x224 loaded in 97.5 s when
    labelled, 4.2 s when read back (bench/README.md, "Labels kept")."""
    key = (name, size, len(train), len(evaluation))
    if key not in _LABELS:
        path = labels_path(*key)
        kept = _read(path)
        if kept is None or [len(a) for a in kept] != [len(train), len(evaluation)]:
            kept = _computed(name, size, train, evaluation, path)
        _LABELS[key] = kept
    return _LABELS[key]


def labels_path(name: str, size: int, n_train: int, n_evaluation: int) -> Path:
    """Where the labels of model ``name`` at ``size`` and these split sizes are kept."""
    return CACHE_DIR / f"labels-{name}-{size}-{n_train}-{n_evaluation}-{labels_key()}.npz"


def labels_key() -> str:
    """What the labels depend on: the source of the models, the crops and the labelling,
    and the versions of the libraries that define or compute them (examples.weights)."""
    code = (models, images, libs, _labels, run_batch, channels_last)
    libraries = {lib: version(lib) for lib in ("numpy", "torchvision", "timm", "scikit-learn")}
    return source_key(code, {"calibration_seed": 1, "evaluation_seed": 2}, **libraries)


def _read(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The labels kept at ``path``, or None (absent or unreadable: computed again)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return f["train"], f["evaluation"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


def _computed(name: str, size: int, train, evaluation, path: Path) -> tuple:
    """The labels of both splits by the float model, written to ``path`` (atomically)."""
    model = build(name, size)
    got = (_labels(model, train), _labels(model, evaluation))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as fh:
        np.savez(fh, train=got[0], evaluation=got[1])
    return got


def _labels(model: torch.nn.Module, x: np.ndarray, batch: int = 16) -> np.ndarray:
    """Top-1 of the float model, run as the stages run it (stages.evaluate.run_batch:
    channels-last batches of the zoo specs' batch_size unless the model rejects them).
    Batches of 32 at 224x224 left MobileNetV2's 0.7 GB of activations in the heap beside
    1000 frames: a 1000-frame run's peak."""
    out, nhwc = [], True
    with torch.no_grad():
        for s in range(0, len(x), batch):
            y, nhwc = run_batch(model, (torch.from_numpy(x[s : s + batch]),), nhwc)
            out.append(y.argmax(1))
    return torch.cat(out).numpy().astype(np.int64)


def __getattr__(attr: str):
    """``examples.zoo.data:<name>`` as a spec's dataset."""
    if attr.startswith("__"):
        raise AttributeError(attr)
    entry, size = entry_of(attr)
    return lambda: dataset(entry.name, size, evaluation_frames())


def miou(outputs, reference, labels) -> dict[str, float]:
    """``data.metric`` of the segmentation models: mean IoU of the stage's class map
    (argmax over channels of ``out``) against the float model's, over the classes the
    float map holds: ``mean_c |S_c & F_c| / |S_c | F_c|``."""
    out = outputs["output.out"] if isinstance(outputs, dict) else outputs
    ref = reference["output.out"] if isinstance(reference, dict) else reference
    got, want = np.asarray(out).argmax(1), np.asarray(ref).argmax(1)
    ious = [
        np.logical_and(got == c, want == c).sum() / np.logical_or(got == c, want == c).sum()
        for c in np.unique(want)
    ]
    return {"miou": float(np.mean(ious))}
