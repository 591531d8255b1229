"""The atomic writer: a unique temp name in the same folder, fsync of the file and of the
folder, a rename; a process killed inside a write leaves the old file."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from schemas import fileio
from schemas.errors import ArtifactError
from schemas.fileio import CRASH_ENV, atomic_save, link_or_copy, parse_json

ROOT = Path(__file__).resolve().parents[2]


def test_atomic_save_uses_a_unique_temp_name_fsyncs_file_and_folder(tmp_path, monkeypatch):
    synced, names = [], []
    real = os.fsync

    def fsync(fd):
        mode = os.fstat(fd).st_mode
        synced.append("folder" if stat.S_ISDIR(mode) else Path(f"/proc/self/fd/{fd}").resolve())
        real(fd)

    def save(name: str) -> None:
        names.append(Path(name))
        Path(name).write_bytes(b"new")

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "m.onnx"
    atomic_save(target, save)
    atomic_save(target, save)
    assert names[0] != names[1]  # two writers never share a temp name
    assert all(n.parent == tmp_path and n.name.startswith(".m.onnx.tmp-") for n in names)
    assert synced == [names[0], "folder", names[1], "folder"]
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["m.onnx"]


def test_a_process_killed_inside_a_write_leaves_the_old_file(tmp_path):
    """SIGKILL after the new bytes are written, before the rename (the crash hook)."""
    target = tmp_path / "m.onnx"
    target.write_bytes(b"old")
    code = (
        "import sys; from pathlib import Path; from schemas.fileio import atomic_save; "
        "atomic_save(sys.argv[1], lambda t: Path(t).write_bytes(b'new'))"
    )
    env = {**os.environ, CRASH_ENV: "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(target)], env=env, cwd=ROOT)
    assert done.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"old"
    (left,) = [p for p in tmp_path.iterdir() if p != target]  # the temp file, hidden
    assert left.name.startswith(".m.onnx.tmp-") and left.read_bytes() == b"new"


def test_link_or_copy_leaves_another_writers_temp_file_alone(tmp_path):
    """The link's temp name is unique: a fixed one (``.<name>.link``) was unlinked and
    reused under a concurrent writer of the same file."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"data")
    other = tmp_path / ".dst.link"
    other.write_bytes(b"another writer's")
    link_or_copy(src, dst)
    assert dst.read_bytes() == b"data" and os.path.samefile(src, dst)
    assert other.read_bytes() == b"another writer's"


def test_link_or_copy_falls_back_to_a_copy(tmp_path, monkeypatch):
    def no_link(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(fileio.os, "link", no_link)
    src, dst = tmp_path / "src", tmp_path / "sub" / "dst"
    src.write_bytes(b"data")
    link_or_copy(src, dst)
    assert dst.read_bytes() == b"data" and not os.path.samefile(src, dst)
    assert os.listdir(dst.parent) == ["dst"]


def test_a_file_where_the_folder_belongs_is_our_error_naming_it(tmp_path):
    (tmp_path / ".cache").write_text("not a folder")
    target = tmp_path / ".cache" / "index" / "k.json"
    with pytest.raises(ArtifactError, match="could not write") as e:
        fileio.atomic_write_text(target, "x")
    assert str(target) in e.value.message and e.value.hint


def test_every_folder_a_write_creates_is_made_durable(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(Path(f"/proc/self/fd/{fd}").resolve())
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "run" / "tables" / "m.json"
    fileio.atomic_write_text(target, "x")
    # a power loss may not drop run/ (or run/tables/) while the file in it survives
    assert tmp_path in synced and tmp_path / "run" in synced
    assert synced[-1] == target.parent and target.read_text() == "x"


def test_read_regular_reads_a_file_and_refuses_what_would_block_or_is_not_one(tmp_path):
    import pytest

    from schemas.errors import ArtifactError
    from schemas.fileio import read_regular
    from tests.no_hang import fails_if_blocked

    (tmp_path / "f.json").write_bytes(b"{}")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "f.json")
    assert read_regular(tmp_path / "f.json") == read_regular(tmp_path / "link") == b"{}"
    with fails_if_blocked():
        for name, kind in [("fifo", "a FIFO"), ("dir", "a folder")]:
            with pytest.raises(ArtifactError, match=f"not a regular file \\({kind}\\)"):
                read_regular(tmp_path / name)
    with pytest.raises(ArtifactError, match="a symlink"):
        read_regular(tmp_path / "link", follow=False)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing")


def test_parse_json_makes_too_deep_a_value_error_like_any_bad_document():
    assert parse_json(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    for bad in (b"[" * 100_000 + b"]" * 100_000, b"{nope", b"\xff"):
        with pytest.raises(ValueError):
            parse_json(bad)
