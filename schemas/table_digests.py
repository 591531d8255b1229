"""Digests of a run's table parts: recorded when a part is written, checked when it is read.

Every part ``tables/<table>/<part>.parquet`` a run writes has its sha256 in the run's
manifest (``tables``), written under the manifest lock. A write is two-phase, so a process
killed at any point leaves parts that still verify: the new digest is recorded as pending,
the file is renamed into place, then the digest is committed (a pending part may match
either digest, or be absent).

Readers (:func:`check_table`) refuse with an :class:`ArtifactError` naming the file a part
whose bytes do not match, a part the manifest does not list and a listed part that is gone:
the file was changed after the run wrote it, and its rows are never read as truth. Runs
written before digests were recorded (``tables`` is None) are read unverified with a
:class:`StoreWarning`; a write into such a run leaves it so (recording only the new parts
would make its older ones look foreign).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

from schemas.errors import ArtifactError
from schemas.fileio import atomic_path, read_regular, sha256_file
from schemas.manifest import Manifest, ManifestError
from schemas.store import Run
from schemas.store_layout import StoreWarning, refuse_foreign_manifest, table_files

CHANGED_HINT = (
    "rerun the run (qparity run SPEC, or qparity rerun RUN --stage STAGE) or restore the "
    "file from a copy; until it verifies, the run's table is not read"
)


def write_part(run: Run, rel: str, write: Callable[[Path], None]) -> Path:
    """Write the part ``rel`` (``write(temp_path)``) atomically and record its sha256 in
    the manifest, all under the manifest lock (pending, rename, commit)."""
    path = run.path(rel)
    with run.manifest_lock():
        legacy = run.manifest().tables is None
        with atomic_path(path) as tmp:
            write(tmp)
            digest = sha256_file(tmp)
            if not legacy:
                run.write_manifest(lambda m: _pending(m, {rel: digest}))
        if not legacy:
            run.write_manifest(lambda m: _commit(m, [rel], {rel: digest}))
    return path


def remove_parts(run: Run, folder: str) -> None:
    """Delete the folder of parts ``folder`` (run-relative, e.g. ``tables/layer_stats/a__b``)
    and drop its parts from the manifest, under the manifest lock."""
    prefix = f"{folder.rstrip('/')}/"
    with run.manifest_lock():
        m = run.manifest()
        gone = sorted(r for r in {**(m.tables or {}), **m.tables_pending} if r.startswith(prefix))
        if m.tables is not None and gone:
            run.write_manifest(lambda m: _pending(m, dict.fromkeys(gone)))
        shutil.rmtree(run.path(folder), ignore_errors=True)
        if m.tables is not None and gone:
            run.write_manifest(lambda m: _commit(m, gone, {}))


def _pending(m: Manifest, parts: dict[str, str | None]) -> Manifest:
    return m.model_copy(update={"tables_pending": {**m.tables_pending, **parts}})


def _commit(m: Manifest, rels: list[str], digests: dict[str, str]) -> Manifest:
    tables = {r: d for r, d in (m.tables or {}).items() if r not in rels} | digests
    pending = {r: d for r, d in m.tables_pending.items() if r not in rels}
    return m.model_copy(update={"tables": tables, "tables_pending": pending})


def read_manifest(run_root: Path) -> Manifest:
    """The manifest of the run folder ``run_root``; :class:`ArtifactError` if unreadable."""
    path = run_root / "manifest.json"
    refuse_foreign_manifest(run_root, None)  # a linked manifest vouches for nothing here
    try:
        m = Manifest.model_validate_json(read_regular(path))
    except (OSError, ArtifactError, ManifestError) as e:
        raise ArtifactError(
            f"no valid manifest.json ({getattr(e, 'what', type(e).__name__)}), so the run's "
            "tables cannot be verified",
            where=str(path),
            hint="delete the folder, or rerun the run",
        ) from e
    refuse_foreign_manifest(run_root, m.run_id)
    return m


def check_table(
    run_root: Path,
    table: str,
    digest_of: Callable[[Path], str] = sha256_file,
    manifest: Manifest | None = None,
) -> list[Path]:
    """The parts of ``table`` in the run folder ``run_root`` (:func:`table_files`), each
    checked against the manifest (``digest_of(path)`` gives its sha256); ArtifactError if
    one fails. Checked twice before failing: a writer may have replaced a part between
    our reading the manifest and the file."""
    error = None
    for _ in range(2):
        files = table_files(run_root, table)
        if not files and not (run_root / "manifest.json").exists():
            return []  # a folder being created: no manifest yet, no tables yet
        m = manifest or read_manifest(run_root)
        if m.tables is None:
            _warn_unverified(run_root)
            return files
        error = _problem(run_root, m, table, {f: digest_of(f) for f in files})
        if error is None:
            return files
        manifest = None
    raise error


def _problem(run_root: Path, m: Manifest, table: str, found: dict[Path, str]) -> Exception | None:
    """The first way the parts ``found`` (path -> sha256) disagree with ``m``, or None."""
    seen = set()
    for path, actual in sorted(found.items()):
        rel = path.relative_to(run_root).as_posix()
        seen.add(rel)
        ok = {m.tables.get(rel), m.tables_pending.get(rel)} - {None}
        if not ok:
            what = "is not a part this run wrote (its manifest lists no such file)"
            return _changed(path, f"{what}: it was added after the run wrote its tables")
        if actual not in ok:
            what = f"was changed after the run wrote it: sha256 {actual}, recorded {min(ok)}"
            return _changed(path, what)
    prefix = f"tables/{table}/"
    seen |= set(m.tables_pending)  # a pending part may be absent (killed mid-write)
    gone = sorted(r for r in m.tables if r.startswith(prefix) and r not in seen)
    if gone:
        return _changed(run_root / gone[0], "was deleted after the run wrote it")
    return None


def _changed(path: Path, what: str) -> ArtifactError:
    return ArtifactError(f"table part {what}", where=str(path), hint=CHANGED_HINT)


def _warn_unverified(run_root: Path) -> None:
    # one message per run (not per table): Python shows an identical warning once
    warnings.warn(
        f"{run_root}: the run was written before table digests were recorded; its tables "
        "are read unverified. Fix: rerun it to get verified tables",
        StoreWarning,
        stacklevel=3,
    )
