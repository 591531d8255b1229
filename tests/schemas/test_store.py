"""Tests of the run store: ids, atomic writes, manifests, artifacts, cache."""

from __future__ import annotations

import os
import threading

import pytest

from schemas.artifacts import Artifact, combined_digest
from schemas.errors import ArtifactError
from schemas.fileio import (
    atomic_copy,
    atomic_write_bytes,
    atomic_write_json,
    new_run_id,
    sha256_bytes,
    sha256_file,
    validate_run_id,
)
from schemas.store import Manifest, Run, RunStore
from tests.no_hang import fails_if_blocked


def make_run(tmp_path) -> tuple[RunStore, Run]:
    store = RunStore(tmp_path / "runs")
    run = store.create_run("demo", "name: demo\n", "ab" * 32, "0.1.0", {"torch": "2"}, {"o": "p"})
    return store, run


def make_artifact(run: Run, data: bytes = b"weights") -> Artifact:
    digest = run.write_file("artifacts/prepare/model.bin", data)
    return Artifact(
        kind="qat_model",
        stage="prepare",
        files={"artifacts/prepare/model.bin": digest},
        inputs_digest=combined_digest(),
        config_digest="cd" * 32,
        code_version="0.1.0",
        versions={"torch": "2"},
    )


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "..", "a..b", ".hidden", "x" * 129, "a\\b"])
def test_run_id_traversal_refused(bad):
    with pytest.raises(ArtifactError, match="invalid run id"):
        validate_run_id(bad)


def test_new_run_id_shape():
    rid = new_run_id("digits-cnn")
    assert validate_run_id(rid) == rid
    name, stamp, tail = rid.rsplit("-", 2)
    assert name == "digits-cnn" and len(stamp) == 15 and stamp[8] == "T" and len(tail) == 6


def test_sha256_file_matches_bytes(tmp_path):
    data = os.urandom(3 << 20)  # several chunks
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == sha256_bytes(data)


def test_atomic_write_failure_keeps_destination(tmp_path, monkeypatch):
    dest = tmp_path / "out.json"
    dest.write_text("old")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(ArtifactError, match="out.json"):
        atomic_write_bytes(dest, b"new")
    assert dest.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_atomic_write_non_os_error_cleans_up(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "x.json", {"a": object()})
    assert list(tmp_path.iterdir()) == []


def test_atomic_json_and_copy(tmp_path):
    atomic_write_json(tmp_path / "sub" / "a.json", {"b": 1, "a": 2})
    assert (tmp_path / "sub" / "a.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    atomic_copy(tmp_path / "sub" / "a.json", tmp_path / "c.json")
    assert sha256_file(tmp_path / "c.json") == sha256_file(tmp_path / "sub" / "a.json")
    with pytest.raises(ArtifactError, match="not found"):
        atomic_copy(tmp_path / "missing", tmp_path / "d.json")


def test_create_open_and_list_runs(tmp_path):
    store, run = make_run(tmp_path)
    assert {p.name for p in run.root.iterdir()} >= {"artifacts", "debug", "tables", "spec.yaml"}
    m = store.open(run.run_id).manifest()
    assert m.status == "running" and m.tags == {"o": "p"} and m.stages == {}
    (store.root / "half-made").mkdir()  # no manifest: not a run
    (store.root / "broken").mkdir()
    (store.root / "broken" / "manifest.json").write_text("{not json")
    (store.root / ".cache").mkdir()
    _, run2 = store, store.create_run("demo", "", "ab" * 32, "0.1.0", {}, {})
    assert [r.run_id for r in store.list_runs()] == [run.run_id, run2.run_id]


def test_open_missing_or_bad_run(tmp_path):
    store, _ = make_run(tmp_path)
    with pytest.raises(ArtifactError, match="qparity runs"):
        store.open("nope")
    with pytest.raises(ArtifactError, match="invalid run id"):
        store.open("../etc")


@pytest.mark.parametrize("rel", ["/etc/passwd", "../other/x", "debug/../../x", "."])
def test_run_path_refuses_escape(tmp_path, rel):
    _, run = make_run(tmp_path)
    with pytest.raises(ArtifactError):
        run.path(rel)


def test_stage_records_and_finish(tmp_path):
    _, run = make_run(tmp_path)
    run.stage_started("prepare")
    run.stage_finished("prepare", "ef" * 32, cache_hit=False)
    run.stage_finished("calibrate", "01" * 32, cache_hit=True, cache_source_run="old-run")
    run.stage_started("qat")
    run.stage_failed("qat", "boom")
    m = run.finish("failed", error="qat failed")
    prep, cal, qat = m.stages["prepare"], m.stages["calibrate"], m.stages["qat"]
    assert prep.status == "complete" and prep.duration_s >= 0 and prep.finished_at
    assert cal.cache_hit and cal.cache_source_run == "old-run"
    assert qat.status == "failed" and qat.error == "boom"
    assert m.status == "failed" and m.finished_at and m == run.manifest()


def test_concurrent_manifest_updates_all_land(tmp_path):
    _, run = make_run(tmp_path)
    stages = [f"s{i}" for i in range(20)]
    barrier = threading.Barrier(2)

    def worker(names):
        barrier.wait()
        for name in names:
            run.stage_started(name)

    threads = [threading.Thread(target=worker, args=(stages[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(run.manifest().stages) == set(stages)


def test_artifact_round_trip_and_digest(tmp_path):
    _, run = make_run(tmp_path)
    art = make_artifact(run)
    run.save_artifact(art)
    loaded = run.load_artifact("prepare", Artifact)
    assert loaded == art and loaded.digest == art.digest
    later = art.model_copy(update={"created_at": "2030-01-01T00:00:00+00:00"})
    assert later.digest == art.digest
    assert art.model_copy(update={"config_digest": "00" * 32}).digest != art.digest


def test_tampered_artifact_file_refused(tmp_path):
    _, run = make_run(tmp_path)
    run.save_artifact(make_artifact(run))
    (run.root / "artifacts/prepare/model.bin").write_bytes(b"tampered")
    with pytest.raises(ArtifactError) as info:
        run.load_artifact("prepare", Artifact)
    msg = str(info.value)
    assert "model.bin" in msg and "expected sha256" in msg and "qparity rerun" in msg
    assert sha256_bytes(b"tampered") in msg


def test_missing_artifact_file_and_bad_json(tmp_path):
    _, run = make_run(tmp_path)
    art = make_artifact(run)
    run.save_artifact(art)
    (run.root / "artifacts/prepare/model.bin").unlink()
    with pytest.raises(ArtifactError, match="model.bin.*missing"):
        run.load_artifact("prepare", Artifact)
    with pytest.raises(ArtifactError, match="missing"):
        run.save_artifact(art)  # files must exist before the artifact is saved
    (run.root / "artifacts/calibrate.json").write_text('{"kind": 1}')
    with pytest.raises(ArtifactError, match=r"calibrate\.json.*not a valid Artifact"):
        run.load_artifact("calibrate", Artifact)
    with pytest.raises(ArtifactError, match="no convert artifact"):
        run.load_artifact("convert", Artifact)


def test_artifact_rejects_unsafe_file_paths():
    with pytest.raises(ValueError, match="relative"):
        Artifact(
            kind="k",
            stage="s",
            files={"../x": "00" * 32},
            inputs_digest="",
            config_digest="",
            code_version="",
            versions={},
        )


def test_combined_digest_order_matters():
    a, b = "aa" * 32, "bb" * 32
    assert combined_digest(a, b) != combined_digest(b, a)
    assert combined_digest(a, b) == combined_digest(a, b)
    with pytest.raises(ValueError):
        combined_digest("xyz")


def test_cache_index(tmp_path):
    store, _ = make_run(tmp_path)
    key = "0123abcd" * 8
    assert store.cache_lookup(key) is None
    store.cache_record(key, {"run_id": "r1", "artifact_digest": "ab"})
    assert store.cache_lookup(key) == {"run_id": "r1", "artifact_digest": "ab"}
    assert (store.root / ".cache" / "index" / f"{key}.json").is_file()
    for bad in ["../x", "ABCDEF12", "short"]:
        with pytest.raises(ArtifactError, match="invalid cache key"):
            store.cache_lookup(bad)
    assert isinstance(store.list_runs()[0], Manifest)


@pytest.mark.parametrize("raw", ['{"x": 1}', '{"run_id": 5}', "[1]", "null", "{bad json"])
def test_a_cache_entry_that_is_not_one_is_an_artifact_error(tmp_path, raw):
    store, _ = make_run(tmp_path)
    key = "0123abcd" * 8
    store.cache_record(key, {"run_id": "r1"})
    (store.root / ".cache" / "index" / f"{key}.json").write_text(raw)
    with pytest.raises(ArtifactError, match=f"{key}.json"):
        store.cache_lookup(key)


@pytest.mark.parametrize("kind", ["fifo", "folder", "link to a fifo", "link to a file"])
def test_a_cache_entry_that_is_no_regular_file_is_an_artifact_error_not_a_hang(tmp_path, kind):
    """A FIFO where the entry belongs blocked every later run of the spec forever."""
    store, run = make_run(tmp_path)
    key = "0123abcd" * 8
    store.cache_record(key, {"run_id": run.run_id})
    entry = store.root / ".cache" / "index" / f"{key}.json"
    entry.unlink()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    make = {"fifo": lambda: os.mkfifo(entry), "folder": entry.mkdir,
            "link to a fifo": lambda: entry.symlink_to(fifo),
            "link to a file": lambda: entry.symlink_to(run.path("manifest.json"))}  # fmt: skip
    make[kind]()
    with fails_if_blocked(), pytest.raises(ArtifactError, match="not a cache entry") as e:
        store.cache_lookup(key)
    assert e.value.where == str(entry) and "delete it" in e.value.hint
    if kind != "folder":  # an atomic write replaces it
        store.cache_record(key, {"run_id": run.run_id})
        assert store.cache_lookup(key) == {"run_id": run.run_id}


def test_a_fifo_for_a_manifest_or_an_artifact_never_blocks_the_store(tmp_path):
    store, run = make_run(tmp_path)
    art = make_artifact(run)
    run.save_artifact(art)
    other = store.create_run("other", "", "ab" * 32, "0.1.0", {}, {})
    for path in (other.path("manifest.json"), run.path("artifacts/prepare.json")):
        path.unlink()
        os.mkfifo(path)
    with fails_if_blocked():
        assert [m.run_id for m in store.list_runs()] == [run.run_id]
        with pytest.raises(ArtifactError, match="a FIFO"):
            run.load_artifact("prepare", Artifact)
