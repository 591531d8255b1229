"""Hostile inputs of #22's security and reliability items, for the catalog
(tests/catalog/test_bad_inputs.py): SQL time limits, spec paths that are empty, pipes,
devices, folders or links out of the allowed roots, and stage cache entries and artifacts
that are not regular files (a FIFO blocked every later run).

Every case works in the scratch folder: the complete run of the catalog is never changed.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from schemas.artifacts import Artifact
from schemas.errors import ArtifactError, QueryError, SpecError
from schemas.store import RunStore
from tests.catalog.cases_inputs import roots
from tests.no_hang import fails_if_blocked

HERE = "tests.catalog.cases_sec"
KEY = "0123abcd" * 8


def must_not_run():
    """A model factory the case must never reach: the weights path is checked first."""
    raise AssertionError("the factory ran before model.weights was checked")


def link_out(path) -> None:
    """A ``model.export`` that leaves a symlink to a file outside the allowed roots."""
    Path(path).symlink_to("/etc/hostname")


def _fresh(env, name: str) -> Path:
    """``env.tmp/name``, removed first whatever it is."""
    path = env.tmp / name
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    return path


def _weights(env, make, factory: str = "tests.models:tiny", extra=()) -> None:
    from stages.modelio import build_float

    path = _fresh(env, "w.safetensors")
    make(env, path)
    with roots(env.tmp, *extra):
        build_float(factory, str(path))


def _fifo_link(env, path: Path) -> None:
    fifo = _fresh(env, "pipe")
    os.mkfifo(fifo)
    path.symlink_to(fifo)


def _ptq(env, make, export: str | None = None, extra=()) -> None:
    from pipelines.ptq import PtqSpec, model_path

    path = _fresh(env, "model.onnx")
    make(env, path)
    model = {"file": str(path), **({"export": export} if export else {})}
    spec = PtqSpec.model_validate({"model": model, "data": {"dataset": "tests.models:data"}})
    with roots(env.tmp, *extra):
        model_path(spec)


def _ptq_file(env, value: str) -> None:
    from pipelines.ptq import PtqSpec, model_path

    spec = PtqSpec.model_validate({"model": {"file": value}, "data": {"dataset": "x:y"}})
    model_path(spec)


def _cache_entry(env, make) -> None:
    """A scratch store whose one cache index entry ``make`` replaced."""
    store = RunStore(_fresh(env, "store"))
    store.cache_record(KEY, {"run_id": "r1"})
    entry = store.root / ".cache" / "index" / f"{KEY}.json"
    entry.unlink()
    make(env, entry)
    store.cache_lookup(KEY)


def _copied(env, rel: str, make, read) -> None:
    """``read`` of a scratch copy of the run whose file ``rel`` ``make`` replaced."""
    root = _fresh(env, "copy")
    shutil.copytree(env.run.root, root / env.run_id, symlinks=True)
    run = RunStore(root).open(env.run_id)
    path = run.path(rel)
    path.unlink()
    make(env, path)
    read(run)


def _artifact(env, make) -> None:
    _copied(env, "artifacts/prepare.json", make, lambda r: r.load_artifact("prepare", Artifact))


def _table_part(env) -> None:
    from schemas.tables import read_run_table

    part = next(p for p in env.run.root.glob("tables/metrics/*.parquet"))
    rel = part.relative_to(env.run.root).as_posix()
    _copied(env, rel, _mkfifo, lambda r: read_run_table(r, "metrics"))


def _sql(env, timeout_s: float) -> None:
    from analysis.query import run_sql

    run_sql(env.root, "SELECT 1", timeout_s=timeout_s)


def _mkfifo(env, path):
    os.mkfifo(path)


def _mkdir(env, path):
    path.mkdir()


def _dev_zero(env, path):
    path.symlink_to("/dev/zero")


def _to_etc(env, path):
    path.symlink_to("/etc/passwd")


def cases() -> dict:
    """The cases, each failing the test instead of hanging if a read blocks on a FIFO."""
    return {name: (_unblocked(fn), cls, says) for name, (fn, cls, says) in _cases().items()}


def _unblocked(fn):
    def call(env):
        with fails_if_blocked():
            return fn(env)

    return call


def _cases() -> dict:
    dev = (Path("/dev"),)
    return {
        "sql time limit not a number": (lambda e: _sql(e, math.nan), QueryError, "not a number"),
        "weights path empty": (lambda e: _build_empty(e), SpecError, "model.weights"),
        "weights a link to a fifo": (lambda e: _weights(e, _fifo_link), SpecError, "FIFO"),
        "weights a device": (lambda e: _weights(e, _dev_zero, extra=dev), SpecError,
                             "character device"),
        "weights linked out of the roots": (lambda e: _weights(e, _to_etc), SpecError, "outside"),
        "weights a fifo, factory not run": (lambda e: _weights(e, _mkfifo, f"{HERE}:must_not_run"),
                                            SpecError, "model.weights"),
        "ptq model.file a fifo": (lambda e: _ptq(e, _mkfifo), SpecError, "FIFO"),
        "ptq model.file a folder": (lambda e: _ptq(e, _mkdir), SpecError, "a folder"),
        "ptq model.file a device": (lambda e: _ptq(e, _dev_zero, extra=dev), SpecError,
                                    "character device"),
        "ptq model.file linked out": (lambda e: _ptq(e, _to_etc), SpecError, "outside"),
        "ptq model.file empty": (lambda e: _ptq_file(e, ""), SpecError, "empty"),
        "ptq model.export links out": (lambda e: _ptq(e, lambda e, p: None, f"{HERE}:link_out"),
                                       SpecError, "outside"),
        "cache entry a fifo": (lambda e: _cache_entry(e, _mkfifo), ArtifactError, "FIFO"),
        "cache entry a folder": (lambda e: _cache_entry(e, _mkdir), ArtifactError, "folder"),
        "cache entry a symlink": (lambda e: _cache_entry(e, _to_etc), ArtifactError, "symlink"),
        "cache entry without run_id": (lambda e: _cache_entry(e, lambda e, p: p.write_text(
                                       '{"x": 1}')), ArtifactError, "run_id"),
        "artifact json a fifo": (lambda e: _artifact(e, _mkfifo), ArtifactError, "FIFO"),
        "artifact json a folder": (lambda e: _artifact(e, _mkdir), ArtifactError, "folder"),
        "manifest a fifo": (lambda e: _copied(e, "manifest.json", _mkfifo, lambda r: r.manifest()),
                            ArtifactError, "FIFO"),
        "table part a fifo": (_table_part, ArtifactError, "FIFO"),
    }  # fmt: skip


def _build_empty(env) -> None:
    from stages.modelio import build_float

    build_float(f"{HERE}:must_not_run", "")
