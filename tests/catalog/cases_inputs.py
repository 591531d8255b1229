"""Spec paths that must be refused before anything reads or writes them, for the catalog
(tests/catalog/test_bad_inputs.py): a FIFO or folder as model.weights, a PTQ model.file
outside the allowed roots (its export never runs).

The scratch folder is not under the allowed roots of the test process; cases that need it
inside widen the roots for the call only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from schemas.errors import SpecError
from schemas.paths import ROOTS_ENV

HERE = "tests.catalog.cases_inputs"


@contextmanager
def roots(*folders: Path) -> Iterator[None]:
    """``$QPARITY_ALLOWED_ROOTS`` set to ``folders`` for the block, then restored."""
    old = os.environ.get(ROOTS_ENV)
    os.environ[ROOTS_ENV] = os.pathsep.join(map(str, folders))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ROOTS_ENV, None)
        else:
            os.environ[ROOTS_ENV] = old


def write_marker(path) -> None:
    """A ``model.export`` that writes a file where it is told (it must never be called
    with a path outside the allowed roots)."""
    Path(path).write_bytes(b"written by model.export")


def _weights(env, make) -> None:
    from stages.modelio import build_float

    path = env.tmp / "w.safetensors"
    if path.exists() or path.is_symlink():
        path.unlink() if not path.is_dir() else path.rmdir()
    make(path)
    with roots(env.tmp):
        build_float("tests.models:tiny", str(path))


def _ptq_outside(env) -> None:
    from pipelines.ptq import PtqSpec, model_path

    target = env.tmp / "exported.onnx"
    spec = PtqSpec.model_validate(
        {"model": {"file": str(target), "export": f"{HERE}:write_marker"},
         "data": {"dataset": "tests.models:data"}}
    )  # fmt: skip
    try:
        model_path(spec)
    finally:
        assert not target.exists(), "model.export wrote outside the allowed roots"


def cases() -> dict:
    return {
        "weights are a fifo": (lambda e: _weights(e, os.mkfifo), SpecError, "FIFO"),
        "weights are a folder": (lambda e: _weights(e, os.mkdir), SpecError, "model.weights"),
        "ptq model.file outside the roots": (_ptq_outside, SpecError, "model.file"),
    }  # fmt: skip
