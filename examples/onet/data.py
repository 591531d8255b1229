"""48x48 crops of the photographs scikit-learn ships (examples/zoo/images.py), without
labels: a face refiner's task metric needs annotated faces, so every stage is judged by its
agreement with the float model, per output."""

from __future__ import annotations

from examples.zoo.images import crops


def load(calibration: int = 128, evaluation: int = 128) -> dict:
    """``{"train": ..., "evaluation": ...}`` in the v2 form, ``x`` float32 N x 3 x 48 x 48."""
    return {
        "train": {"inputs": {"x": crops(calibration, 48, seed=0)}, "labels": None},
        "evaluation": {"inputs": {"x": crops(evaluation, 48, seed=1)}, "labels": None},
    }


def load_few() -> dict:
    """16 crops per split: a quick look at the chain (and the example's test)."""
    return load(16, 16)
