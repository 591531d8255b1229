"""The run store under attack, for the catalog (tests/catalog/test_bad_inputs.py): linked
or copied run files, a store that is no folder, tampered table digests, files of a run that
lead out of it.

Every case works in a scratch store or on a scratch copy of the catalog's complete run.
"""

from __future__ import annotations

import io
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.artifacts import CalibratedModel
from schemas.errors import ArtifactError
from schemas.store import RunStore
from tests.catalog.cases_files import _copied_run

STATE = "artifacts/calibrate/qat.safetensors"


def _scratch(env, name: str) -> RunStore:
    """An empty store of its own under the scratch folder."""
    root = env.tmp / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    return RunStore(root)


def _linked_manifest(env):
    from rich.console import Console

    from qparity.views import show_run

    store = _scratch(env, "linked-manifest")
    (store.root / "twin").mkdir()
    (store.root / "twin" / "manifest.json").symlink_to(env.run.root / "manifest.json")
    return show_run(Console(file=io.StringIO()), store.root, "twin")


def _copied_under_another_name(env):
    store = _scratch(env, "copied-run")
    shutil.copytree(env.run.root, store.root / "copy-of-run")
    return store.open("copy-of-run").manifest()


def _read(run, table: str):
    from schemas.tables import read_run_table

    return read_run_table(run, table)


def _part_linked(env):
    run = _copied_run(env)
    part = run.path("tables/metrics/calibrate.parquet")
    part.unlink()
    part.symlink_to(env.run.path("tables/metrics/calibrate.parquet"))
    return _read(run, "metrics")


def _linked_out(env, rel: str):
    """``rel`` of a copied run replaced by a symlink to a copy outside the run."""
    run = _copied_run(env)
    outside = env.tmp / f"outside-{run.path(rel).name}"
    shutil.copy(run.path(rel), outside)
    run.path(rel).unlink()
    (run.root / rel).symlink_to(outside)
    return run


def _runs_row_changed(env):
    run = _copied_run(env)
    part = run.path("tables/runs/run.parquet")
    rows = pq.read_table(part).to_pylist()
    rows[0]["status"] = "failed"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(part)), part)
    return _read(run, "runs")


def _manifest_digests(env, edit):
    """A copied run whose manifest's table digests ``edit`` changed (the parts are intact)."""
    run = _copied_run(env)
    path = run.root / "manifest.json"
    data = json.loads(path.read_text())
    edit(data["tables"])
    path.write_text(json.dumps(data))
    return _read(run, "stages")


def _store_root(path):
    from qparity.cli_options import store_root

    return store_root(str(path))


def _file(env, name: str):
    path = env.tmp / name
    path.write_text("not a store")
    return path


def _fifo_store(env):
    path = env.tmp / "store-fifo"
    if not path.exists():
        os.mkfifo(path)
    return _store_root(path)


def _dangling_store(env):
    link = env.tmp / "store-dangling"
    if not link.is_symlink():
        link.symlink_to(env.tmp / "nowhere")
    return _store_root(link)


def _env_names_a_file(env):
    from qparity.cli_options import store_root

    before = os.environ.get("QPARITY_RUNS")
    os.environ["QPARITY_RUNS"] = str(_file(env, "env-store.txt"))
    try:
        return store_root(None)
    finally:
        os.environ.pop("QPARITY_RUNS") if before is None else os.environ.update(QPARITY_RUNS=before)


def _cache_is_a_file(env):
    store = _scratch(env, "cache-file")
    (store.root / ".cache").write_text("not a folder")
    return store.cache_record("ab" * 16, {"run_id": env.run_id, "stage": "prepare"})


def _sql_inside_a_file(env):
    from analysis.query import run_sql

    return run_sql(_file(env, "sql-store.txt") / "runs", "SELECT 1")


def _gc_of_a_file(env):
    from pipelines.gc import mark_interrupted

    return mark_interrupted(RunStore(_file(env, "gc-store.txt")))


def cases() -> dict:
    return {
        "store: show of a symlinked manifest.json": (_linked_manifest, ArtifactError, "twin"),
        "store: run copied under another name": (_copied_under_another_name, ArtifactError,
                                                 "copy-of-run"),
        "store: table part replaced by a symlink": (_part_linked, ArtifactError,
                                                    "calibrate.parquet"),
        "store: spec.yaml linked out of the run": (
            lambda e: _linked_out(e, "spec.yaml").path("spec.yaml"), ArtifactError, "spec.yaml"),
        "store: artifact file linked out of the run": (
            lambda e: _linked_out(e, STATE).load_artifact("calibrate", CalibratedModel),
            ArtifactError, "qat.safetensors"),
        "store: runs row with a changed status": (_runs_row_changed, ArtifactError,
                                                  "run.parquet"),
        "store: manifest lost a part's digest": (
            lambda e: _manifest_digests(e, lambda t: t.pop("tables/stages/calibrate.parquet")),
            ArtifactError, "calibrate.parquet"),
        "store: manifest digest rewritten": (
            lambda e: _manifest_digests(
                e, lambda t: t.update({"tables/stages/prepare.parquet": "0" * 64})),
            ArtifactError, "prepare.parquet"),
        "store: root inside a file": (lambda e: _store_root(_file(e, "holder.txt") / "runs"),
                                      ArtifactError, "holder.txt"),
        "store: root is a fifo": (_fifo_store, ArtifactError, "store-fifo"),
        "store: root is a dangling symlink": (_dangling_store, ArtifactError, "store-dangling"),
        "store: $QPARITY_RUNS names a file": (_env_names_a_file, ArtifactError, "env-store.txt"),
        "store: .cache is a file": (_cache_is_a_file, ArtifactError, ".cache"),
        "store: sql over a store inside a file": (_sql_inside_a_file, ArtifactError,
                                                  "sql-store.txt"),
        "store: gc of a store that is a file": (_gc_of_a_file, ArtifactError, "gc-store.txt"),
    }  # fmt: skip
