"""Where a spec may point: files a spec names stay inside the allowed roots.

The allowed roots are the current working directory and the qparity checkout, plus any
folder listed in ``$QPARITY_ALLOWED_ROOTS`` (``os.pathsep``-separated): a spec found on a
shared drive cannot make qparity read ``/etc`` or another user's files unless the person
running it widens the roots.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from schemas.errors import SpecError

ROOTS_ENV = "QPARITY_ALLOWED_ROOTS"
REPO = Path(__file__).resolve().parent.parent


def allowed_roots() -> list[Path]:
    """The folders spec paths may point into."""
    extra = [Path(p) for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p]
    return [p.resolve() for p in (Path.cwd(), REPO, *extra)]


def checked_path(value: str | Path, field: str) -> Path:
    """``value`` resolved (symlinks followed); SpecError if it is empty or leaves the
    allowed roots (an empty path resolved to the working folder)."""
    if not str(value).strip():
        raise SpecError(
            "the path is empty", where=field, hint="give the file's path, or leave the key out"
        )
    path = Path(value).expanduser().resolve()
    roots = allowed_roots()
    if not any(path == r or r in path.parents for r in roots):
        raise SpecError(
            f"{path} is outside the allowed folders ({', '.join(map(str, roots))})",
            where=field,
            hint=f"move the file under one of them, or add its folder to ${ROOTS_ENV}",
        )
    return path


def checked_file(value: str | Path, field: str) -> Path:
    """:func:`checked_path` of a file to read: SpecError unless it is a regular file.

    A FIFO or a device would block the reader forever (or stream without end), so only a
    regular file (after following symlinks) passes; the check is a ``stat``, which never
    blocks."""
    path = checked_path(value, field)
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise SpecError(
            f"cannot read {path} ({e.strerror or e})",
            where=field,
            hint="check that the file exists and is readable",
        ) from e
    if not stat.S_ISREG(mode):
        raise SpecError(
            f"{path} is not a regular file ({_kind(mode)})",
            where=field,
            hint="point to a file on disk, not a pipe, device, socket or folder",
        )
    return path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"
