"""What of a local store folder is read: its run folders and their table parts.

Two rules every reader (``qparity runs``, ``show``, ``sql``) shares:

- the store root must be a folder (or not exist yet): a file named by ``--runs`` or
  ``$QPARITY_RUNS`` is an :class:`~schemas.errors.ArtifactError`, never an empty store;
- nothing is read through a symlink. A symlinked run folder, manifest.json or table part
  could point outside the store, or at another run of it and so count that run twice: it
  is skipped with a :class:`StoreWarning` naming the link when listing, and refused with
  an ArtifactError when opened by its id;
- a run is read only from the folder named by its id: a folder whose manifest names
  another run (``cp -r`` of a run under a new name) would count that run twice.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from schemas.errors import ArtifactError
from schemas.fileio import parse_json, read_regular

_ROOT_HINT = "pass --runs a folder (or a URL such as s3://bucket/runs), or set $QPARITY_RUNS"
_LINK_HINT = "copy the run into the store (cp -r) instead of linking it, or delete the link"
_COPY_HINT = (
    "a run is read from the folder named by its id: delete the copy, or rename the folder "
    "to the run id its manifest names"
)


class StoreWarning(UserWarning):
    """Something in the store was skipped (a symlinked run folder or table part)."""


def check_root(root: Path) -> Path:
    """``root`` if it is a folder or can become one; else :class:`ArtifactError`.

    The nearest existing ancestor is checked too, so ``file.txt/runs`` fails here rather
    than as a NotADirectoryError when the first run is created."""
    for path in (root, *root.parents):
        if path.exists() or path.is_symlink():
            if path.is_dir():
                return root
            what = "is not a folder" if path == root else f"is inside {path}, which is not a folder"
            raise ArtifactError(
                f"the run store {what}: it must be a folder (or a URL)",
                where=str(root),
                hint=_ROOT_HINT,
            )
    return root


def _link_text(path: Path) -> str:
    try:
        return f"a symlink to {os.readlink(path)}"
    except OSError:
        return "a symlink"


def refused_link(path: Path) -> bool:
    """True (with a :class:`StoreWarning` naming ``path``) if ``path`` is a symlink."""
    if not path.is_symlink():
        return False
    warnings.warn(
        f"{path}: {_link_text(path)}, not read (symlinks in a run store are refused). "
        f"Fix: {_LINK_HINT}",
        StoreWarning,
        stacklevel=3,
    )
    return True


def refuse_linked_run(folder: Path) -> None:
    """:class:`ArtifactError` if the run folder ``folder`` is a symlink."""
    if folder.is_symlink():
        raise ArtifactError(
            f"the run folder is {_link_text(folder)}; symlinked run folders are refused",
            where=str(folder),
            hint=_LINK_HINT,
        )


def manifest_problem(folder: Path, run_id: str | None) -> tuple[str, str] | None:
    """Why the manifest.json of the run folder ``folder`` (naming ``run_id``, if known) is
    not read as that folder's run, and the fix; None if it is fine."""
    path = folder / "manifest.json"
    if path.is_symlink():
        return f"its manifest.json is {_link_text(path)}", _LINK_HINT
    if run_id is not None and run_id != folder.name:
        return f"its manifest.json names run {run_id!r} (a copied or renamed run)", _COPY_HINT
    return None


def refuse_foreign_manifest(folder: Path, run_id: str | None) -> None:
    """:class:`ArtifactError` if :func:`manifest_problem` finds one."""
    problem = manifest_problem(folder, run_id)
    if problem is not None:
        raise ArtifactError(
            f"the run folder is refused: {problem[0]}", where=str(folder), hint=problem[1]
        )


def _skipped_manifest(folder: Path) -> bool:
    """True (with a :class:`StoreWarning`) if ``folder``'s manifest is linked or foreign."""
    path = folder / "manifest.json"
    problem = manifest_problem(folder, None if path.is_symlink() else _named_run(path))
    if problem is not None:
        warnings.warn(
            f"{folder}: {problem[0]}, not read. Fix: {problem[1]}", StoreWarning, stacklevel=3
        )
    return problem is not None


def _named_run(manifest: Path) -> str | None:
    """The run id ``manifest`` names; None if it cannot be read (not a run yet, or damaged:
    the readers say what is wrong)."""
    try:
        run_id = parse_json(read_regular(manifest)).get("run_id")
    except (OSError, ValueError, AttributeError, ArtifactError):  # a FIFO: never block
        return None
    return run_id if isinstance(run_id, str) else None


def run_folders(root: Path) -> list[Path]:
    """The run folders of the store ``root``, sorted: folders whose names do not start
    with '.' or '_' (the cache and other bookkeeping); symlinked folders and folders whose
    manifest.json is a symlink or names another run skipped with a warning."""
    if not root.is_dir():
        return []
    with os.scandir(root) as entries:
        names = sorted(e.name for e in entries if e.name[0] not in "._")
    folders = [root / name for name in names]
    return [f for f in folders if f.is_dir() and not refused_link(f) and not _skipped_manifest(f)]


def table_files(run_root: Path, table: str) -> list[Path]:
    """The Parquet parts of ``table`` in the run folder ``run_root``, sorted; hidden names
    (atomic writes' temp files) skipped, symlinked folders and parts skipped with a warning."""
    tables = run_root / "tables"
    folder = tables / table
    if refused_link(tables) or refused_link(folder) or not folder.is_dir():
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):  # never descends into a link
        here = Path(dirpath)
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and not refused_link(here / d)
        )
        found += [
            here / f
            for f in sorted(filenames)
            if f.endswith(".parquet") and not f.startswith(".") and not refused_link(here / f)
        ]
    return sorted(found)
