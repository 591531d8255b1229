"""Crops of scikit-learn's two sample photographs at 320 x 320 (examples/zoo/images.py),
no labels: every output map is scored by its agreement with the float model, and the
detections decoded from all maps by :func:`examples.detector.metric.map50`."""

from __future__ import annotations

from examples.detector.model import SIZE
from examples.zoo.images import crops


def load(calibration: int = 64, evaluation: int = 64, size: int = SIZE) -> dict:
    return {
        "train": {"inputs": {"x": crops(calibration, size, 0)}, "labels": None},
        "evaluation": {"inputs": {"x": crops(evaluation, size, 1)}, "labels": None},
    }


def few() -> dict:
    """4 crops of 96 x 96 per split: the example's test (the maps go down to 1 x 1)."""
    return load(4, 4, 96)
