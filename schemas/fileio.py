"""File-level primitives of the run store: digests, atomic writes, ids and timestamps.

Every file is written to a hidden temp name in its folder, fsynced and renamed into place,
so a crash never leaves a half-written file under a real name.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from schemas.errors import ArtifactError

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
HEX_KEY_RE = re.compile(r"^[0-9a-f]{8,128}$")


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe folder name, else raise :class:`ArtifactError`."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id) or ".." in run_id:
        raise ArtifactError(
            f"invalid run id {run_id!r}: expected 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'",
            hint="`qparity runs` lists runs",
        )
    return run_id


def utc_now() -> str:
    """The current time as ISO-8601 UTC with microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def new_run_id(name: str) -> str:
    """A fresh run id: ``<name>-<yyyymmddTHHMMSS>-<6 hex>`` (UTC)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return validate_run_id(f"{name[:105]}-{stamp}-{uuid.uuid4().hex[:6]}")


def sha256_bytes(data: bytes) -> str:
    """sha256 hex of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 hex of a regular file, read in chunks (:func:`open_regular`: a FIFO is an
    ArtifactError, never a read that blocks)."""
    h = hashlib.sha256()
    with open_regular(path) as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_regular(path: str | Path, follow: bool = True) -> bytes:
    """The bytes of ``path`` if it is a regular file (:func:`open_regular`)."""
    with open_regular(path, follow) as fh:
        return fh.read()


def open_regular(path: str | Path, follow: bool = True) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file; :class:`ArtifactError` if it is
    a FIFO, device, socket or folder (or, with ``follow=False``, a symlink).

    Opened non-blocking and checked on the open descriptor: a FIFO left where the store
    keeps a file would block a plain read forever (every later run, or ``qparity sql``,
    would hang), and a check before the open could be raced. FileNotFoundError passes
    through (a miss)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symlink under O_NOFOLLOW; EACCES, ...
        what = "a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise ArtifactError(f"cannot read the file ({what})", where=str(path)) from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ArtifactError(
            f"not a regular file ({_file_kind(mode)})",
            where=str(path),
            hint="the store writes only regular files: remove it",
        )
    return os.fdopen(fd, "rb")


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISDIR: "a folder", stat.S_ISCHR: "a device",
             stat.S_ISBLK: "a device", stat.S_ISSOCK: "a socket"}  # fmt: skip
    return next((name for test, name in kinds.items() if test(mode)), "a special file")


def parse_json(raw: str | bytes) -> Any:
    """``json.loads``; a document nested deeper than its parser goes (it recurses per
    level: a RecursionError) is a ValueError, as any other bad document is."""
    try:
        return json.loads(raw)
    except RecursionError as e:
        raise ValueError("JSON nested deeper than the parser goes") from e


def canonical_json(obj: Any) -> bytes:
    """JSON with sorted keys and no whitespace: equal data, equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def json_digest(obj: Any) -> str:
    """sha256 hex of :func:`canonical_json`."""
    return sha256_bytes(canonical_json(obj))


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temp path next to ``path``; what the block writes there replaces ``path``
    only if the block completes.

    The temp name is ``.<name>.tmp-<uuid>`` in the same folder (two writers never share
    one). After the block the file is fsynced, renamed over ``path`` and the folder is
    fsynced. On any error the temp file is removed and ``path`` is untouched; OS errors
    become :class:`ArtifactError`. Every file the product writes goes through here.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        make_folders(path.parent)
        yield tmp
        _fsync(tmp)
        _crash_point()
        os.replace(tmp, path)
        _fsync(path.parent)
    except BaseException as e:
        with suppress(OSError):  # no temp file, or its folder is a file: the error below says
            tmp.unlink()
        if isinstance(e, OSError):
            raise ArtifactError(
                f"could not write the file ({e})",
                where=str(path),
                hint="free disk space, fix the folder permissions, or move away a file that stands "
                "where a folder of the path belongs; nothing was replaced",
            ) from e
        raise


def atomic_save(path: str | Path, save: Callable[[str], object]) -> None:
    """Write ``path`` atomically through a library call that writes to a file name
    (``save(name)``: ``onnx.save``, safetensors' ``save_file``, a compiler's ``-o``)."""
    with atomic_path(path) as tmp:
        save(str(tmp))


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[IO[bytes]]:
    """Yield a binary file that replaces ``path`` only if the block completes
    (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "xb") as fh:
        yield fh


CRASH_ENV = "QPARITY_CRASH_AT_WRITE"
"""Crash-harness hook (bench/crash.py): when set to N, the process kills itself with
SIGKILL during its N-th atomic write, after the data is written and before the rename,
the worst moment for a writer. Unset in normal use: the check is one dict lookup."""
_WRITES = [0]


def _crash_point() -> None:
    at = os.environ.get(CRASH_ENV)
    if at is None:
        return
    _WRITES[0] += 1
    if _WRITES[0] == int(at):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def make_folders(folder: str | Path) -> None:
    """Create ``folder`` and its missing parents, each made durable: the folder holding a
    new one is fsynced, so a power loss never drops a folder (a whole new run) whose files
    were fsynced. OS errors propagate (:func:`atomic_path` words them)."""
    folder = Path(folder)
    missing = [p for p in (folder, *folder.parents) if not p.is_dir()][::-1]
    for new in missing:
        try:
            new.mkdir()
        except FileExistsError:
            if not new.is_dir():
                raise
            continue  # another writer made it: it fsyncs its parent itself
        _fsync(new.parent)


def _fsync(path: Path) -> None:
    """fsync a file or a folder (a folder: so a rename into it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_writer(path) as fh:
        fh.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON (sorted keys, indent 2) to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, sort_keys=True, indent=2) + "\n")


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (replacing it atomically); copy across file systems."""
    try:
        with atomic_path(dst) as tmp:
            os.link(src, tmp)
    except ArtifactError:  # another file system, or one without hard links: copy instead
        atomic_copy(src, dst)


def atomic_copy(src: str | Path, dst: str | Path) -> None:
    """Copy ``src`` to ``dst`` atomically."""
    try:
        with open(src, "rb") as fin, atomic_writer(dst) as fout:
            shutil.copyfileobj(fin, fout)
    except FileNotFoundError as e:
        raise ArtifactError("source file not found", where=str(src)) from e
