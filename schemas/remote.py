"""Run stores at fsspec URLs (``s3://bucket/runs``, ``gcs://...``, ``memory://...``).

Every stage, query and command works on plain local files, so a store at a URL is a
local *mirror* plus the remote copy:

- writing: files go to the mirror exactly as in a local store; at every manifest write
  (stage started/finished, run finished) and at :meth:`Remote.push` the run's new or changed
  files are uploaded, ``manifest.json`` last. A reader on another machine therefore never
  sees a manifest naming a file that is not there yet.
- reading: opening a run downloads the files whose remote size or version token changed
  since the last sync; :meth:`Remote.pull_all` does that for the whole store (one listing)
  before SQL reads its tables.
- the stage cache index (``.cache/index/<key>.json``) is read from and written to the
  remote, so a worker reuses what any other worker computed.

Uploads to object stores (one PUT is atomic there) go straight to the name; on other
file systems to a hidden temp name first, then moved. The mirror lives under
``$QPARITY_MIRROR`` (default ``~/.cache/qparity/mirror``), one folder per URL; per-run sync
state lives in ``<mirror>/.sync/<run_id>.json`` under a file lock, so two processes on
one machine can share a mirror.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from schemas.errors import ArtifactError
from schemas.fileio import atomic_write_bytes, atomic_write_json, parse_json

MIRROR_ENV = "QPARITY_MIRROR"
ATOMIC_PUT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory"})
"""Protocols whose single-object write is atomic: no temp name needed."""
MANIFEST = "manifest.json"
_HINT = (
    "check the URL, the credentials (e.g. AWS_* variables) and the endpoint "
    "(FSSPEC_S3_ENDPOINT_URL for an S3-compatible server)"
)


def is_url(root: str | Path) -> bool:
    """True if ``root`` names a remote store (``proto://...`` other than ``file://``)."""
    return isinstance(root, str) and "://" in root and not root.startswith("file://")


def default_store_root() -> str | Path:
    """The run store: $QPARITY_RUNS (a folder or an fsspec URL), else ./runs."""
    env = os.environ.get("QPARITY_RUNS")
    return (env if is_url(env) else Path(env)) if env else Path("runs")


def local_root(root: str | Path) -> Path:
    """A local store root as a path (``file://`` stripped)."""
    text = str(root)
    return Path(text[len("file://") :] if text.startswith("file://") else text)


def absolute_root(root: str | Path) -> str | Path:
    """A store root other processes can use: URLs as given, local folders made absolute."""
    return root.rstrip("/") if is_url(root) else local_root(root).resolve()


def mirror_base() -> Path:
    """Where mirrors of remote stores live: ``$QPARITY_MIRROR`` or ``~/.cache/qparity/mirror``."""
    env = os.environ.get(MIRROR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "qparity" / "mirror"


class Remote:
    """The remote half of a store at an fsspec URL (module docstring)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.base = _filesystem(self.url)
        self.base = self.base.rstrip("/")
        self.atomic_put = bool(set(_protocols(self.fs)) & ATOMIC_PUT)
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.mirror = mirror_base() / digest
        self.mirror.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"Remote({self.url!r} -> {str(self.mirror)!r})"

    # -- runs --------------------------------------------------------------------------

    def push(self, run_id: str) -> int:
        """Upload the run's files that changed since the last sync, manifest last."""
        folder = self.mirror / run_id
        with self._sync_state(run_id) as state:
            changed = [
                rel
                for rel, sig in _local_files(folder).items()
                if state.get(rel, {}).get("local") != sig
            ]
            changed.sort(key=lambda rel: rel == MANIFEST)
            for rel in changed:
                self._put(folder / rel, f"{run_id}/{rel}")
            if changed:
                self._remember(run_id, folder, changed, state)
        return len(changed)

    def pull(self, run_id: str) -> int | None:
        """Download the run's files that changed remotely since the last sync; None when
        the remote has no such run (a stale copy in the mirror does not count)."""
        listing = self._listing(f"{self.base}/{run_id}")
        return self._pull_listing(run_id, listing) if MANIFEST in listing else None

    def pull_all(self) -> int:
        """Download every run's changed files (one recursive listing of the store)."""
        by_run: dict[str, dict[str, str]] = {}
        for rel, tok in self._listing(self.base).items():
            run_id, _, inner = rel.partition("/")
            if inner and run_id[0] not in "._":
                by_run.setdefault(run_id, {})[inner] = tok
        return sum(self._pull_listing(r, files) for r, files in sorted(by_run.items()))

    def run_ids(self) -> list[str]:
        """Names of the store's run folders (those not starting with '.' or '_')."""
        try:
            self.fs.invalidate_cache()
            entries = self.fs.ls(self.base, detail=True) if self.fs.exists(self.base) else []
        except Exception as e:  # noqa: BLE001 - any backend error, reported with the URL
            raise _error("cannot list the store", self.url, e) from e
        names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries]
        types = [e.get("type") for e in entries]
        return sorted(
            n for n, t in zip(names, types, strict=True) if t == "directory" and n[0] not in "._"
        )

    def manifests(self, run_ids: list[str]) -> dict[str, bytes]:
        """The raw manifest.json of each run that has one (fetched together)."""
        paths = {f"{self.base}/{r}/{MANIFEST}": r for r in run_ids}
        try:
            got = self.fs.cat(list(paths), on_error="omit") if paths else {}
        except Exception as e:  # noqa: BLE001
            raise _error("cannot read the run manifests", self.url, e) from e
        return {
            paths[_strip(self.fs, p)]: data
            for p, data in got.items()
            if _strip(self.fs, p) in paths
        }

    def copy_files(self, src_run: str, dst_run: str, rels: list[str]) -> None:
        """Server-side copies of ``rels`` from one run to another, recorded as in sync so
        :meth:`push` does not upload them again (object stores only; elsewhere the next
        push uploads them)."""
        if not self.atomic_put or not rels:
            return
        with self._sync_state(dst_run) as state:
            for rel in rels:
                try:
                    self.fs.copy(f"{self.base}/{src_run}/{rel}", f"{self.base}/{dst_run}/{rel}")
                except Exception as e:  # noqa: BLE001
                    raise _error(f"cannot copy {src_run}/{rel}", self.url, e) from e
            self._remember(dst_run, self.mirror / dst_run, rels, state)

    # -- the cache index -----------------------------------------------------------------

    def read(self, rel: str) -> bytes | None:
        """The bytes of ``rel`` under the store, or None if it does not exist."""
        try:
            return self.fs.cat_file(f"{self.base}/{rel}")
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001
            raise _error(f"cannot read {rel}", self.url, e) from e

    def write(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` under the store (atomically as seen by readers)."""
        local = self.mirror / rel
        atomic_write_bytes(local, data)
        self._put(local, rel)

    # -- internals ---------------------------------------------------------------------

    def _put(self, local: Path, rel: str) -> None:
        dst = f"{self.base}/{rel}"
        try:
            if self.atomic_put:
                self.fs.put_file(str(local), dst)
                return
            tmp = f"{dst.rsplit('/', 1)[0]}/.{dst.rsplit('/', 1)[-1]}.tmp-{uuid.uuid4().hex}"
            self.fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(local), tmp)
            self.fs.mv(tmp, dst)
        except Exception as e:  # noqa: BLE001
            raise _error(f"cannot upload {rel}", self.url, e) from e

    def _listing(self, prefix: str) -> dict[str, str]:
        """``{path relative to prefix: version token}`` of every file under ``prefix``."""
        try:
            self.fs.invalidate_cache()  # listings are cached by some backends (s3fs)
            found = self.fs.find(prefix, detail=True)
        except FileNotFoundError:
            found = {}
        except Exception as e:  # noqa: BLE001
            raise _error("cannot list the store", self.url, e) from e
        out = {}
        for name, info in found.items():
            rel = _strip(self.fs, name)[len(prefix) + 1 :]
            if rel and not any(part.startswith(".") for part in rel.split("/")):
                out[rel] = _token(info)
        return out

    def _pull_listing(self, run_id: str, remote: dict[str, str]) -> int:
        folder = self.mirror / run_id
        with self._sync_state(run_id) as state:
            todo = sorted((r for r, t in remote.items() if state.get(r, {}).get("remote") != t),
                          key=lambda rel: rel == MANIFEST)  # fmt: skip
            for rel in todo:
                target = (folder / rel).resolve()
                if not target.is_relative_to(folder.resolve()):
                    raise ArtifactError(
                        f"remote file {rel!r} escapes the run folder", where=self.url
                    )
                try:
                    data = self.fs.cat_file(f"{self.base}/{run_id}/{rel}")
                except Exception as e:  # noqa: BLE001
                    raise _error(f"cannot download {run_id}/{rel}", self.url, e) from e
                atomic_write_bytes(target, data)
                state[rel] = {"local": _signature(target), "remote": remote[rel]}
        return len(todo)

    def _remember(self, run_id: str, folder: Path, rels: list[str], state: dict) -> None:
        """Record the local signature and remote token of files just uploaded."""
        remote = self._listing(f"{self.base}/{run_id}")
        for rel in rels:
            state[rel] = {"local": _signature(folder / rel), "remote": remote.get(rel)}

    @contextmanager
    def _sync_state(self, run_id: str) -> Iterator[dict[str, Any]]:
        """The run's sync state, locked for the block and saved after it."""
        sync = self.mirror / ".sync"
        sync.mkdir(exist_ok=True)
        with open(sync / f"{run_id}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = sync / f"{run_id}.json"
            try:
                state = parse_json(path.read_bytes()) if path.is_file() else {}
            except ValueError:
                state = {}  # a damaged state only costs a full re-sync
            before = json.dumps(state, sort_keys=True)
            try:
                yield state
            finally:
                if json.dumps(state, sort_keys=True) != before:  # no fsync for a no-op sync
                    atomic_write_json(path, state)
                fcntl.flock(lock, fcntl.LOCK_UN)


def _filesystem(url: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise ArtifactError(
            f"the store URL needs a package that is not installed ({e})",
            where=url,
            hint="for s3:// install s3fs (pip install 'qparity[s3]'); gcs:// needs gcsfs",
        ) from e
    except (ValueError, TypeError) as e:
        raise ArtifactError(
            f"not a store URL fsspec understands ({e})",
            where=url,
            hint="use a local folder or a URL such as s3://bucket/runs",
        ) from e


def _protocols(fs) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _strip(fs, name: str) -> str:
    return fs._strip_protocol(name).rstrip("/")


def _token(info: dict) -> str:
    """A version token from a listing entry: size plus the backend's etag or time."""
    for key in ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "created"):
        if info.get(key) is not None:
            return f"{info.get('size')}:{info[key]}"
    return f"{info.get('size')}"


def _signature(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _local_files(folder: Path) -> dict[str, list[int]]:
    """``{relative path: [size, mtime_ns]}`` of a run folder's files (hidden ones skipped)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith("."):
                full = Path(dirpath) / name
                out[full.relative_to(folder).as_posix()] = _signature(full)
    return out


def _error(what: str, url: str, e: Exception) -> ArtifactError:
    return ArtifactError(f"{what} ({type(e).__name__}: {e})", where=url, hint=_HINT)
