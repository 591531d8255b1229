"""The run store's low-level writer: digests, atomic writes, the manifest, runs.

Layout under the store root (``runs/``)::

    <run_id>/manifest.json     written last: a folder without it is not a run
    <run_id>/spec.yaml         the spec as given
    <run_id>/artifacts/<stage>.json, debug/, tables/<table>/<part>.parquet
    .cache/index/<key>.json    content-addressed stage cache (key -> payload)

Every file is written to a hidden temp name in its folder, fsynced and renamed into
place, so a crash never leaves a half-written file under a real name. A loaded artifact
is checked against the sha256 of every file it owns.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from schemas.errors import ArtifactError
from schemas.fileio import (
    HEX_KEY_RE,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    link_or_copy,
    make_folders,
    new_run_id,
    parse_json,
    read_regular,
    sha256_bytes,
    sha256_file,
    utc_now,
    validate_run_id,
)
from schemas.manifest import Judging, Manifest, ManifestError, StageRecord
from schemas.owner import is_mine, this_owner
from schemas.remote import Remote, is_url, local_root
from schemas.store_layout import (
    check_root,
    refuse_foreign_manifest,
    refuse_linked_run,
    run_folders,
)

if TYPE_CHECKING:
    from schemas.artifacts import Artifact

A = TypeVar("A", bound="Artifact")

_RERUN_HINT = "rerun the stage (qparity rerun) or delete the run"
_BAD_ENTRY_HINT = "delete it; a run computing the stage rewrites it"


class Run:
    """One run folder: paths inside it, its manifest, its files and artifacts."""

    def __init__(self, root: str | Path, run_id: str, remote: Remote | None = None):
        self.run_id = validate_run_id(run_id)
        self.root = Path(root) / run_id
        self.remote = remote
        self.debug_written: list[str] = []
        """Names written by :meth:`write_debug` through this object, in order."""

    def __repr__(self) -> str:
        return f"Run({str(self.root)!r})"

    def path(self, rel: str | Path) -> Path:
        """The absolute path of ``rel`` inside the run; refuses anything outside it."""
        if Path(rel).is_absolute():
            raise ArtifactError(f"path {str(rel)!r} must be relative to the run folder")
        base = self.root.resolve()
        full = (base / rel).resolve()
        if not full.is_relative_to(base) or full == base:
            raise ArtifactError(
                f"path {str(rel)!r} escapes the run folder (a symlink or '..' leading out)",
                where=str(self.root),
                hint="a run's files must lie inside its folder: replace the symlink with the "
                "file itself, or rerun the run",
            )
        return full

    def manifest(self) -> Manifest:
        """Read and validate manifest.json; refused if it is a symlink or another run's."""
        path = self.root / "manifest.json"
        refuse_foreign_manifest(self.root, None)
        try:
            m = Manifest.model_validate_json(read_regular(path))
        except FileNotFoundError as e:
            raise ArtifactError("run has no manifest.json", where=str(self.root)) from e
        except ManifestError as e:
            raise ArtifactError(f"invalid manifest: {e}", where=str(path), hint=_RERUN_HINT) from e
        refuse_foreign_manifest(self.root, m.run_id)
        return m

    @contextmanager
    def manifest_lock(self) -> Iterator[None]:
        """Hold the run's exclusive manifest lock (not reentrant: call
        :meth:`write_manifest`, never :meth:`update_manifest`, inside it)."""
        with open(self.root / ".manifest.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def write_manifest(self, fn: Callable[[Manifest], Manifest]) -> Manifest:
        """Apply ``fn`` to the manifest and write it atomically; the caller holds
        :meth:`manifest_lock` (a running run's owner writing it refreshes its heartbeat)."""
        new = _beat(fn(self.manifest()))
        atomic_write_json(self.root / "manifest.json", new.model_dump(mode="json"))
        self.publish()
        return new

    def update_manifest(self, fn: Callable[[Manifest], Manifest]) -> Manifest:
        """Apply ``fn`` to the manifest under the exclusive lock and write it atomically."""
        with self.manifest_lock():
            return self.write_manifest(fn)

    def heartbeat(self) -> Manifest:
        """Tell readers the run's owner is alive (:func:`schemas.owner.heartbeat`)."""
        return self.update_manifest(lambda m: m)

    def publish(self) -> None:
        """For a store at a URL: upload what changed in the run, manifest last (no-op locally).

        Manifest writes call this; call it after writing files outside a manifest update."""
        if self.remote is not None:
            self.remote.push(self.run_id)

    def _set_stage(self, stage: str, fresh: bool = False, **changes: Any) -> Manifest:
        """Create (``fresh``) or update the record of ``stage`` with ``changes``."""

        def apply(m: Manifest) -> Manifest:
            old = None if fresh else m.stages.get(stage)
            base = old.model_dump() if old else {"stage": stage, "started_at": utc_now()}
            if "finished_at" in changes:  # duration from the recorded start
                end = datetime.fromisoformat(changes["finished_at"])
                base["duration_s"] = (
                    end - datetime.fromisoformat(base["started_at"])
                ).total_seconds()
            rec = StageRecord.model_validate({**base, **changes})
            return m.model_copy(update={"stages": {**m.stages, stage: rec}})

        return self.update_manifest(apply)

    def stage_started(self, stage: str) -> Manifest:
        """Record that ``stage`` started now (replaces an earlier record of it)."""
        return self._set_stage(stage, fresh=True, status="running")

    def stage_finished(
        self,
        stage: str,
        artifact_digest: str,
        cache_hit: bool,
        cache_source_run: str | None = None,
    ) -> Manifest:
        """Record that ``stage`` completed with the artifact of ``artifact_digest``."""
        return self._set_stage(
            stage,
            status="complete",
            finished_at=utc_now(),
            artifact_digest=artifact_digest,
            cache_hit=cache_hit,
            cache_source_run=cache_source_run,
            error=None,
        )

    def stage_failed(self, stage: str, error: str) -> Manifest:
        """Record that ``stage`` failed with ``error``."""
        return self._set_stage(stage, status="failed", finished_at=utc_now(), error=error)

    def finish(
        self,
        status: Literal["complete", "failed"],
        error: str | None = None,
        finished_at: str | None = None,
    ) -> Manifest:
        """Mark the whole run complete or failed, ended at ``finished_at`` (default now)."""
        end = finished_at or utc_now()
        return self.update_manifest(
            lambda m: m.model_copy(update={"status": status, "finished_at": end, "error": error})
        )

    def write_file(self, rel: str | Path, data: bytes) -> str:
        """Write ``data`` to ``rel`` atomically; return its sha256."""
        atomic_write_bytes(self.path(rel), data)
        return sha256_bytes(data)

    def write_text(self, rel: str | Path, text: str) -> str:
        """Write UTF-8 ``text`` to ``rel`` atomically; return its sha256."""
        return self.write_file(rel, text.encode("utf-8"))

    def write_debug(self, name: str, text: str) -> str:
        """Write ``debug/<name>`` atomically and remember ``name`` in :attr:`debug_written`,
        so the stage that wrote it keeps a copy with its artifact (pipelines.stage_debug)."""
        digest = self.write_text(f"debug/{name}", text)
        self.debug_written.append(name)
        return digest

    def save_artifact(self, art: Artifact) -> Path:
        """Verify the artifact's files, then write ``artifacts/<stage>.json`` atomically."""
        self.verify_artifact(art)
        path = self.path(f"artifacts/{art.stage}.json")
        atomic_write_json(path, art.model_dump(mode="json"))
        return path

    def load_artifact(self, stage: str, cls: type[A]) -> A:
        """Read ``artifacts/<stage>.json`` as ``cls`` and verify every file it owns."""
        path = self.path(f"artifacts/{stage}.json")
        from pydantic import ValidationError  # here: the data commands never load pydantic

        try:
            art = cls.model_validate_json(read_regular(path))
        except FileNotFoundError as e:
            raise ArtifactError(f"no {stage} artifact", where=str(path), hint=_RERUN_HINT) from e
        except ValidationError as e:
            msg = f"not a valid {cls.__name__}: {e}"
            raise ArtifactError(msg, where=str(path), hint=_RERUN_HINT) from e
        if art.stage != stage:
            raise ArtifactError(
                f"artifact is for stage {art.stage!r}, not {stage!r}", where=str(path)
            )
        self.verify_artifact(art)
        return art

    def verify_artifact(self, art: Artifact) -> None:
        """Check that every file of ``art`` exists and has the recorded sha256."""
        for rel, expected in sorted(art.files.items()):
            path = self.path(rel)
            if not path.is_file():
                raise ArtifactError(
                    f"file of the {art.stage} artifact is missing (expected sha256 {expected})",
                    where=str(path),
                    hint=_RERUN_HINT,
                )
            actual = sha256_file(path)
            if actual != expected:
                raise ArtifactError(
                    f"file of the {art.stage} artifact changed: expected sha256 {expected}, "
                    f"actual {actual}",
                    where=str(path),
                    hint=_RERUN_HINT,
                )


def _beat(m: Manifest) -> Manifest:
    """``m`` with its heartbeat refreshed when it is running and owned by this process."""
    if m.status != "running" or m.owner is None or not is_mine(m.owner):
        return m
    return m.model_copy(update={"owner": m.owner.model_copy(update={"heartbeat_at": utc_now()})})


class RunStore:
    """The folder of all runs, plus the content-addressed stage cache index.

    ``root`` is a folder or an fsspec URL (``s3://bucket/runs``): then runs live in a local
    mirror that is synced with the URL (:mod:`schemas.remote`). A local ``root`` that is a
    file is an :class:`ArtifactError`; symlinked run folders are never read
    (:mod:`schemas.store_layout`).
    """

    def __init__(self, root: str | Path):
        self.remote = Remote(str(root)) if is_url(root) else None
        self.root = self.remote.mirror if self.remote else check_root(local_root(root))
        self.location = self.remote.url if self.remote else str(self.root)

    def __repr__(self) -> str:
        return f"RunStore({self.location!r})"

    def local_copy(self) -> Path:
        """The store as a local folder, every run synced first when it lives at a URL."""
        if self.remote is not None:
            self.remote.pull_all()
        return self.root

    def create_run(
        self,
        name: str,
        spec_text: str,
        spec_digest: str,
        code_version: str,
        versions: dict[str, str],
        tags: dict[str, str],
        parent_run: str | None = None,
        judging: Judging | None = None,
    ) -> Run:
        """Make a new run folder with spec.yaml and a 'running' manifest (written last)
        naming this process as its owner and recording what the run is judged by."""
        run = Run(self.root, new_run_id(name), self.remote)
        for sub in ("artifacts", "debug", "tables"):
            make_folders(run.root / sub)  # durable: a power loss keeps the new run folder
        atomic_write_text(run.root / "spec.yaml", spec_text)
        manifest = Manifest(
            run_id=run.run_id,
            name=name,
            spec_digest=spec_digest,
            status="running",
            started_at=utc_now(),
            code_version=code_version,
            versions=versions,
            tags=tags,
            parent_run=parent_run,
            owner=this_owner(),
            judging=judging,
            tables={},
        )
        atomic_write_json(run.root / "manifest.json", manifest.model_dump(mode="json"))
        run.publish()
        return run

    def open(self, run_id: str) -> Run:
        """Open an existing run; :class:`ArtifactError` if there is none of that id."""
        run = Run(self.root, run_id, self.remote)
        missing = self.remote is not None and self.remote.pull(run.run_id) is None
        if missing or not (run.root / "manifest.json").is_file():
            raise ArtifactError(
                f"no run {run_id!r}", where=self.location, hint="`qparity runs` lists runs"
            )
        refuse_linked_run(run.root)
        refuse_foreign_manifest(run.root, None)
        return run

    def list_runs(self) -> list[Manifest]:
        """Manifests of every run, oldest first; folders without a valid one are skipped,
        and so are copies of a run under another name (:mod:`schemas.store_layout`)."""
        found = []
        for name, raw in self._raw_manifests():
            try:
                m = Manifest.model_validate_json(raw)
            except ManifestError:
                continue  # not (yet) a run: created mid-way or foreign
            if m.run_id == name:
                found.append(m)
        return sorted(found, key=lambda m: (m.started_at, m.run_id))

    def _raw_manifests(self) -> list[tuple[str, bytes]]:
        """(folder name, manifest.json bytes) of every run folder."""
        if self.remote is not None:
            return list(self.remote.manifests(self.remote.run_ids()).items())
        found = []
        for folder in run_folders(self.root):
            try:
                found.append((folder.name, read_regular(folder / "manifest.json")))
            except (OSError, ArtifactError):  # a FIFO there would hang every later run
                continue
        return found

    def _cache_path(self, key: str) -> Path:
        if not isinstance(key, str) or not HEX_KEY_RE.match(key):
            raise ArtifactError(f"invalid cache key {key!r}: expected 8-128 lowercase hex digits")
        return self.root / ".cache" / "index" / f"{key}.json"

    def reuse_files(self, src: Run, dst: Run, rels: list[str]) -> None:
        """Give ``dst`` the files ``rels`` of ``src`` (a cache hit): hard links locally and,
        on a URL store, server-side copies recorded as in sync (not uploaded again)."""
        for rel in rels:
            link_or_copy(src.path(rel), dst.path(rel))
        if self.remote is not None:
            self.remote.copy_files(src.run_id, dst.run_id, rels)

    def cache_lookup(self, key: str) -> dict[str, Any] | None:
        """The payload recorded under ``key``, or None (a miss); :class:`ArtifactError` if
        the entry is unreadable or not an object naming a ``run_id``."""
        path = self._cache_path(key)
        try:
            if self.remote is not None:
                raw = self.remote.read(path.relative_to(self.root).as_posix())
                if raw is None:
                    return None
            else:
                raw = read_regular(path, follow=False)  # never blocks on a FIFO
            payload = parse_json(raw)
        except FileNotFoundError:
            return None
        except ArtifactError as e:
            raise ArtifactError(
                f"not a cache entry: {e.what}", where=str(path), hint=_BAD_ENTRY_HINT
            ) from e
        except (OSError, ValueError) as e:
            raise ArtifactError(f"unreadable cache entry ({e})", where=str(path)) from e
        if not isinstance(payload, dict) or not isinstance(payload.get("run_id"), str):
            raise ArtifactError(
                f"not a cache entry (expected an object with a run_id): {raw[:80]!r}",
                where=str(path),
                hint=_BAD_ENTRY_HINT,
            )
        return payload

    def cache_record(self, key: str, payload: dict[str, Any]) -> None:
        """Record ``payload`` under ``key`` (atomic; replaces an earlier entry)."""
        path = self._cache_path(key)
        if self.remote is not None:
            data = (json.dumps(payload, sort_keys=True, indent=2) + "\n").encode()
            self.remote.write(path.relative_to(self.root).as_posix(), data)
        else:
            atomic_write_json(path, payload)
