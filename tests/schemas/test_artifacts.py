"""Artifact models: built on first use, validating as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import inspect
from pydantic import BaseModel, ValidationError
import schemas.artifacts as a
models = [c for c in vars(a).values() if inspect.isclass(c) and issubclass(c, BaseModel)
          and c.__module__ == a.__name__]
built = [c.__name__ for c in models if c.__pydantic_complete__]
m = a.Metric(stage="qat", metric="top1", value=0.5, n_samples=8)
try:
    a.Metric(stage="qat", metric="top1", value=0.5, n_samples=8, extra=1)
except ValidationError:
    refused = True
print(len(models), built, m.value, refused)
"""


def test_artifact_models_are_built_when_first_used_and_validate_as_before():
    """`qparity show` reads one kind of artifact: the other models are not built (their
    validators cost ~20 ms of its start-up; bench/cli.py)."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-500:]
    n, rest = proc.stdout.split(" ", 1)
    assert int(n) >= 10 and rest.strip() == "[] 0.5 True"
