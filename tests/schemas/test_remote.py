"""Tests of run stores at fsspec URLs: the mirror, push/pull, the shared cache index.

Two "machines" are two mirror folders on one fsspec ``memory://`` file system; the
S3 end-to-end test across processes is tests/pipelines/test_remote_store.py.
"""

from __future__ import annotations

import uuid

import fsspec
import pytest

from schemas.errors import ArtifactError
from schemas.remote import MIRROR_ENV, Remote, absolute_root, is_url, local_root
from schemas.store import RunStore
from tests.schemas.test_store import make_artifact


@pytest.fixture
def url():
    """A fresh memory:// store, removed afterwards."""
    root = f"memory://qparity-test-{uuid.uuid4().hex[:8]}/runs"
    yield root
    fs, top = fsspec.filesystem("memory"), root.replace("memory://", "/").rsplit("/", 1)[0]
    if fs.exists(top):
        fs.rm(top, recursive=True)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """``machine(name)`` makes later stores use that machine's own mirror folder."""

    def use(name: str) -> None:
        monkeypatch.setenv(MIRROR_ENV, str(tmp_path / f"mirror-{name}"))

    use("a")
    return use


def new_run(url):
    store = RunStore(url)
    return store, store.create_run("demo", "name: demo\n", "ab" * 32, "0.1.0", {}, {"k": "v"})


def remote_files(url: str) -> set[str]:
    r = Remote(url)
    return {p[len(r.base) + 1 :] for p in r.fs.find(r.base)}


def test_urls_and_local_paths():
    assert is_url("s3://bucket/runs") and is_url("memory://x")
    assert not is_url("runs") and not is_url("file:///tmp/runs")
    assert str(local_root("file:///tmp/runs")) == "/tmp/runs"
    assert absolute_root("s3://bucket/runs/") == "s3://bucket/runs"
    assert absolute_root("runs").is_absolute()


def test_a_new_run_is_on_the_remote_with_its_manifest(url, machine):
    store, run = new_run(url)
    assert store.root != run.root and run.root.parent == store.root  # the mirror
    names = remote_files(url)
    assert {f"{run.run_id}/manifest.json", f"{run.run_id}/spec.yaml"} <= names
    assert not any(n.split("/")[-1].startswith(".") for n in names)  # no lock, no temp


def test_the_manifest_is_uploaded_after_the_files_it_names(url, machine, monkeypatch):
    store, run = new_run(url)
    art = make_artifact(run)
    run.save_artifact(art)
    order: list[str] = []
    real = store.remote.fs.put_file
    monkeypatch.setattr(
        store.remote.fs, "put_file", lambda src, dst, **kw: (order.append(dst), real(src, dst))
    )
    run.stage_finished("prepare", art.digest, cache_hit=False)
    assert order[-1].endswith("/manifest.json")
    assert any(o.endswith("artifacts/prepare/model.bin") for o in order[:-1])


def test_another_machine_lists_opens_and_verifies_the_run(url, machine):
    _, run = new_run(url)
    art = make_artifact(run)
    run.save_artifact(art)
    run.stage_finished("prepare", art.digest, cache_hit=False)
    machine("b")
    other = RunStore(url)
    assert [m.run_id for m in other.list_runs()] == [run.run_id]
    opened = other.open(run.run_id)
    assert opened.root != run.root
    assert opened.load_artifact("prepare", type(art)).digest == art.digest
    assert opened.manifest().stages["prepare"].status == "complete"


def test_pull_downloads_only_what_changed(url, machine):
    _, run = new_run(url)
    run.write_file("debug/a.txt", b"one")
    run.publish()
    machine("b")
    other = RunStore(url)
    other.open(run.run_id)
    assert other.remote.pull(run.run_id) == 0  # nothing changed since the open
    machine("a")
    run.write_file("debug/a.txt", b"two!")
    run.publish()
    assert other.remote.pull(run.run_id) == 1
    assert (other.root / run.run_id / "debug/a.txt").read_bytes() == b"two!"


def test_push_uploads_only_what_changed(url, machine):
    _, run = new_run(url)
    run.write_file("debug/a.txt", b"one")
    assert run.remote.push(run.run_id) == 1
    assert run.remote.push(run.run_id) == 0


def test_the_writing_machine_does_not_download_its_own_files(url, machine):
    store, run = new_run(url)
    run.write_file("debug/a.txt", b"one")
    run.publish()
    assert store.remote.pull(run.run_id) == 0


def test_the_cache_index_is_shared(url, machine):
    RunStore(url).cache_record("ab" * 8, {"run_id": "r1", "stage": "prepare"})
    machine("b")
    assert RunStore(url).cache_lookup("ab" * 8) == {"run_id": "r1", "stage": "prepare"}
    assert RunStore(url).cache_lookup("cd" * 8) is None


def test_sql_sees_runs_written_on_another_machine(url, machine):
    from pipelines.runs import stage_row

    _, run = new_run(url)
    art = make_artifact(run)
    run.save_artifact(art)
    m = run.stage_finished("prepare", art.digest, cache_hit=False)
    stage_row(run, m.stages["prepare"], 0.5, art.digest, False)
    run.publish()
    machine("b")
    from analysis.query import run_sql

    got = run_sql(url, "SELECT run_id, stage FROM stages").to_pylist()
    assert got == [{"run_id": run.run_id, "stage": "prepare"}]


def test_a_tampered_remote_file_fails_its_digest_on_the_reader(url, machine):
    _, run = new_run(url)
    art = make_artifact(run)
    run.save_artifact(art)
    run.stage_finished("prepare", art.digest, cache_hit=False)
    remote = Remote(url)
    remote.fs.pipe_file(f"{remote.base}/{run.run_id}/artifacts/prepare/model.bin", b"evil")
    machine("b")
    with pytest.raises(ArtifactError, match="changed: expected sha256"):
        RunStore(url).open(run.run_id).load_artifact("prepare", type(art))


def test_unknown_runs_and_bad_urls_are_clear_errors(url, machine):
    with pytest.raises(ArtifactError, match=url + ": no run 'nope'"):
        RunStore(url).open("nope")
    with pytest.raises(ArtifactError, match="not a store URL fsspec understands"):
        RunStore("nosuchproto://bucket/runs")
    with pytest.raises(ArtifactError, match="invalid run id"):
        RunStore(url).open("../escape")


def test_an_unreachable_store_names_the_url_and_what_to_check(tmp_path, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path / "m"))
    store = RunStore("memory://unreachable/runs")

    def boom(*a, **k):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(store.remote.fs, "exists", boom)
    with pytest.raises(ArtifactError, match="cannot list the store.*connection refused") as e:
        store.list_runs()
    assert "memory://unreachable/runs" in str(e.value) and "endpoint" in str(e.value)


def test_a_run_deleted_on_the_remote_is_gone_for_readers(url, machine):
    store, run = new_run(url)
    store.open(run.run_id)  # the mirror holds a copy
    store.remote.fs.rm(f"{store.remote.base}/{run.run_id}", recursive=True)
    with pytest.raises(ArtifactError, match=f"no run '{run.run_id}'"):
        store.open(run.run_id)


def test_an_empty_store_has_no_runs(url, machine):
    assert RunStore(url).list_runs() == []
    assert RunStore(url).local_copy().is_dir()


def test_files_reused_by_a_cache_hit_are_copied_on_the_server_not_uploaded(url, machine):
    store, src = new_run(url)
    art = make_artifact(src, b"w" * 1000)
    src.save_artifact(art)
    src.stage_finished("prepare", art.digest, cache_hit=False)
    dst = store.create_run("demo", "name: demo\n", "ab" * 32, "0.1.0", {}, {})
    uploads: list[str] = []
    real = store.remote.fs.put_file
    store.remote.fs.put_file = lambda s, d, **kw: (uploads.append(d), real(s, d))
    try:
        store.reuse_files(src, dst, list(art.files))
        dst.save_artifact(art)
        dst.stage_finished("prepare", art.digest, cache_hit=True, cache_source_run=src.run_id)
    finally:
        store.remote.fs.put_file = real
    assert not any(u.endswith("model.bin") for u in uploads)
    assert any(u.endswith("artifacts/prepare.json") for u in uploads)
    machine("b")
    RunStore(url).open(dst.run_id).load_artifact("prepare", type(art))  # present and verified
