"""``examples.onnx_zoo.export:<name>``: a PTQ spec's ``model.export`` writing that graph."""

from __future__ import annotations

from pathlib import Path

import onnx

from examples.onnx_zoo.graphs import BUILDERS
from schemas.fileio import atomic_save


def write(name: str, path: str | Path) -> Path:
    """Build graph ``name`` and save it to ``path`` (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = BUILDERS[name]()
    atomic_save(path, lambda tmp: onnx.save(model, tmp))
    return path


def __getattr__(attr: str):
    if attr not in BUILDERS:
        raise AttributeError(f"no ONNX zoo graph {attr!r}; there are {sorted(BUILDERS)}")
    return lambda path: write(attr, path)
