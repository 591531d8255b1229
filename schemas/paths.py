"""Where a spec may point: files a spec names stay inside the allowed roots.

The allowed roots are the current working directory and the qparity checkout, plus any
folder listed in ``$QPARITY_ALLOWED_ROOTS`` (``os.pathsep``-separated): a spec found on a
shared drive cannot make qparity read ``/etc`` or another user's files unless the person
running it widens the roots.
"""

from __future__ import annotations

import os
from pathlib import Path

from schemas.errors import SpecError

ROOTS_ENV = "QPARITY_ALLOWED_ROOTS"
REPO = Path(__file__).resolve().parent.parent


def allowed_roots() -> list[Path]:
    """The folders spec paths may point into."""
    extra = [Path(p) for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p]
    return [p.resolve() for p in (Path.cwd(), REPO, *extra)]


def checked_path(value: str | Path, field: str) -> Path:
    """``value`` resolved (symlinks followed); SpecError if it leaves the allowed roots."""
    path = Path(value).expanduser().resolve()
    roots = allowed_roots()
    if not any(path == r or r in path.parents for r in roots):
        raise SpecError(
            f"{path} is outside the allowed folders ({', '.join(map(str, roots))})",
            where=field,
            hint=f"move the file under one of them, or add its folder to ${ROOTS_ENV}",
        )
    return path
