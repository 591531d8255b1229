"""Crops of scikit-learn's two sample photographs at 320 x 320 (examples/zoo/images.py),
no labels: every output map is scored by its agreement with the float model, and the
detections decoded from all maps by :func:`examples.detector.metric.map50`."""

from __future__ import annotations

from examples.detector.model import SIZE
from examples.zoo.images import crops


def load(calibration: int = 64, evaluation: int = 64) -> dict:
    return {
        "train": {"inputs": {"x": crops(calibration, SIZE, 0)}, "labels": None},
        "evaluation": {"inputs": {"x": crops(evaluation, SIZE, 1)}, "labels": None},
    }


def few() -> dict:
    """8 crops per split: the example's test."""
    return load(8, 8)
