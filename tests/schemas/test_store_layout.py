"""What of a store is read: the root must be a folder, nothing is read through a symlink."""

from __future__ import annotations

import shutil

import pytest

from schemas.errors import ArtifactError
from schemas.store import RunStore
from schemas.store_layout import StoreWarning
from schemas.tables import read_run_table, write_rows


def _metric(run, stage: str) -> None:
    row = {
        "run_id": run.run_id,
        "stage": stage,
        "metric": "top1",
        "value": 0.5,
        "n_samples": 1,
        "output": None,
    }
    write_rows(run, "metrics", [row], part=stage)


@pytest.fixture
def linked(tmp_path):
    """A store with one real run, a link to it and a link to a run outside the store.
    Returns (store, real run, name of the inner link, name of the outer link)."""
    store = RunStore(tmp_path / "runs")
    real = store.create_run("real", "", "ab" * 32, "0.1.0", {}, {})
    _metric(real, "qat")
    elsewhere = RunStore(tmp_path / "elsewhere").create_run("far", "", "cd" * 32, "0.1.0", {}, {})
    (store.root / "twin").symlink_to(real.root, target_is_directory=True)
    (store.root / elsewhere.run_id).symlink_to(elsewhere.root, target_is_directory=True)
    return store, real, "twin", elsewhere.run_id


def test_symlinked_run_folders_are_not_listed_and_each_link_is_named(linked):
    store, real, twin, far = linked
    with pytest.warns(StoreWarning) as caught:
        runs = store.list_runs()
    assert [m.run_id for m in runs] == [real.run_id]
    named = " ".join(str(w.message) for w in caught)
    assert str(store.root / twin) in named and str(store.root / far) in named


@pytest.mark.parametrize("which", [2, 3])
def test_opening_a_symlinked_run_folder_is_refused(linked, which):
    store, name = linked[0], linked[which]
    with pytest.raises(ArtifactError, match="symlink") as e:
        store.open(name)
    assert str(store.root / name) in e.value.message and e.value.hint


def test_a_symlinked_table_part_or_folder_is_not_read(linked, tmp_path):
    store, real, *_ = linked
    parts = real.root / "tables" / "metrics"
    (parts / "copy.parquet").symlink_to(parts / "qat.parquet")
    outside = tmp_path / "outside"
    shutil.copytree(parts, outside)
    (parts / "more").symlink_to(outside, target_is_directory=True)
    with pytest.warns(StoreWarning) as caught:
        rows = read_run_table(real, "metrics")
    assert [r["stage"] for r in rows] == ["qat"]
    named = " ".join(str(w.message) for w in caught)
    assert str(parts / "copy.parquet") in named and str(parts / "more") in named


@pytest.mark.parametrize("inside", [False, True])
def test_a_store_root_that_is_a_file_is_an_error_naming_it(tmp_path, inside):
    path = tmp_path / "notes.txt"
    path.write_text("not a store")
    root = path / "runs" if inside else path
    with pytest.raises(ArtifactError, match="must be a folder") as e:
        RunStore(root)
    assert str(root) in e.value.message and "--runs" in e.value.hint


def test_a_store_root_that_does_not_exist_yet_is_fine(tmp_path):
    store = RunStore(tmp_path / "new" / "runs")
    assert store.list_runs() == []
    store.create_run("x", "", "ab" * 32, "0.1.0", {}, {})
    assert len(store.list_runs()) == 1


@pytest.fixture
def twin(tmp_path):
    """A store with one run with a table, and a folder ``twin`` whose manifest is that
    run's: a copy of the whole run folder or a symlinked manifest.json."""

    def make(kind: str):
        store = RunStore(tmp_path / "runs")
        real = store.create_run("real", "", "ab" * 32, "0.1.0", {}, {})
        _metric(real, "qat")
        if kind == "copy":
            shutil.copytree(real.root, store.root / "twin")
        else:
            (store.root / "twin").mkdir()
            (store.root / "twin" / "manifest.json").symlink_to(real.root / "manifest.json")
        return store, real

    return make


@pytest.mark.parametrize("kind", ["copy", "link"])
def test_a_copied_or_linked_manifest_is_not_a_second_run(twin, kind):
    store, real = twin(kind)
    with pytest.warns(StoreWarning, match="twin"):
        assert [m.run_id for m in store.list_runs()] == [real.run_id]
    with pytest.raises(ArtifactError, match="refused") as e:
        store.open("twin").manifest()
    assert str(store.root / "twin") in e.value.message and e.value.hint


def test_sql_counts_a_copied_run_once(twin):
    from analysis.query import run_sql

    store, real = twin("copy")
    with pytest.warns(StoreWarning, match="twin"):
        rows = run_sql(store.root, "SELECT run_id FROM metrics").to_pylist()
    assert rows == [{"run_id": real.run_id}]


DEEP = b"[" * 100_000 + b"]" * 100_000
"""A JSON document nested past the parser's recursion limit."""


def test_a_manifest_nested_too_deep_is_a_damaged_run_never_a_crash(tmp_path):
    from analysis.query import run_sql

    store = RunStore(tmp_path / "runs")
    good = store.create_run("good", "", "ab" * 32, "0.1.0", {}, {})
    _metric(good, "qat")
    deep = store.create_run("deep", "", "cd" * 32, "0.1.0", {}, {})
    _metric(deep, "qat")
    (deep.root / "manifest.json").write_bytes(DEEP)
    assert [m.run_id for m in store.list_runs()] == [good.run_id]
    with pytest.raises(ArtifactError, match="nested deeper") as e:
        store.open(deep.run_id).manifest()
    assert str(deep.root / "manifest.json") in e.value.where
    with pytest.warns(StoreWarning, match="no valid manifest.json"):
        rows = run_sql(store.root, "SELECT run_id FROM metrics").to_pylist()
    assert rows == [{"run_id": good.run_id}]
