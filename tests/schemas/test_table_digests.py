"""Table parts carry their sha256 in the manifest; a changed, added or deleted part is refused."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import fileio
from schemas.errors import ArtifactError
from schemas.fileio import sha256_file
from schemas.store import RunStore
from schemas.store_layout import StoreWarning
from schemas.table_digests import remove_parts
from schemas.tables import read_run_table, read_table, write_rows

PART = "tables/metrics/calibrate.parquet"


def _rows(run_id: str, value: float = 0.5) -> list[dict]:
    return [{"run_id": run_id, "stage": "calibrate", "metric": "top1", "value": value,
             "n_samples": 10, "output": None}]  # fmt: skip


@pytest.fixture
def run(tmp_path):
    run = RunStore(tmp_path).create_run("demo", "", "ab" * 32, "0.1.0", {}, {})
    write_rows(run, "metrics", _rows(run.run_id), "calibrate")
    return run


def _tamper(run, value: float = 0.99) -> None:
    """Replace the part by a valid Parquet file whose metric value differs."""
    table = pq.read_table(run.path(PART))
    data = table.to_pylist()
    data[0]["value"] = value
    pq.write_table(pa.Table.from_pylist(data, schema=table.schema), run.path(PART))


def test_each_written_part_has_its_sha256_in_the_manifest(run):
    assert run.manifest().tables == {PART: sha256_file(run.path(PART))}
    assert read_run_table(run, "metrics")[0]["value"] == 0.5


def test_a_valid_parquet_with_a_changed_value_is_refused_naming_the_file(run, tmp_path):
    _tamper(run)
    for read in (lambda: read_run_table(run, "metrics"), lambda: read_table(tmp_path, "metrics")):
        with pytest.raises(ArtifactError, match="changed after the run wrote it") as info:
            read()
        assert str(run.path(PART)) in info.value.message and "rerun" in info.value.hint


def test_a_part_the_manifest_does_not_list_is_refused(run):
    pq.write_table(pq.read_table(run.path(PART)), run.path("tables/metrics/extra.parquet"))
    with pytest.raises(ArtifactError, match="not a part this run wrote") as info:
        read_run_table(run, "metrics")
    assert "extra.parquet" in info.value.message


def test_a_deleted_part_is_refused(run):
    run.path(PART).unlink()
    with pytest.raises(ArtifactError, match="deleted after the run wrote it"):
        read_run_table(run, "metrics")


def test_rewriting_a_part_records_the_new_digest(run):
    write_rows(run, "metrics", _rows(run.run_id, 0.75), "calibrate")
    assert read_run_table(run, "metrics")[0]["value"] == 0.75
    assert run.manifest().tables_pending == {}


@pytest.mark.parametrize("killed", ["before the rename", "after the rename"])
def test_a_write_killed_midway_still_verifies(run, monkeypatch, killed):
    def die(*_):
        raise KeyboardInterrupt  # stands in for SIGKILL: nothing after it runs

    if killed == "before the rename":
        monkeypatch.setattr(fileio, "_crash_point", die)
    else:
        monkeypatch.setattr(type(run), "write_manifest", _nth_call_dies(run.write_manifest, 2))
    with pytest.raises(KeyboardInterrupt):
        write_rows(run, "metrics", _rows(run.run_id, 0.75), "calibrate")
    monkeypatch.undo()
    assert read_run_table(run, "metrics")[0]["value"] in (0.5, 0.75)
    _tamper(run, 0.1)  # the pending digest is no licence for other bytes
    with pytest.raises(ArtifactError, match="changed after the run wrote it"):
        read_run_table(run, "metrics")


def _nth_call_dies(method, n: int):
    calls = []

    def wrapped(self, fn):
        calls.append(fn)
        if len(calls) == n:
            raise KeyboardInterrupt
        return method(fn)

    return wrapped


def test_removed_parts_leave_the_manifest(run):
    write_rows(run, "metrics", _rows(run.run_id), "pair/b00000")
    remove_parts(run, "tables/metrics/pair")
    assert list(run.manifest().tables) == [PART]
    assert len(read_run_table(run, "metrics")) == 1


def test_a_run_written_before_digests_is_read_with_a_warning(run):
    run.update_manifest(lambda m: m.model_copy(update={"tables": None}))
    write_rows(run, "metrics", _rows(run.run_id), "later")
    assert run.manifest().tables is None  # old parts would look foreign if new ones counted
    _tamper(run)
    with pytest.warns(StoreWarning, match="before table digests were recorded"):
        rows = read_run_table(run, "metrics")
    assert len(rows) == 2


def test_no_warning_for_a_verified_run(run):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_run_table(run, "metrics")


def test_a_fifo_for_a_part_is_refused_not_read(run):
    """Hashing a FIFO blocked forever: ``qparity sql`` over the store hung before its time
    limit began."""
    import os

    from tests.no_hang import fails_if_blocked

    run.path(PART).unlink()
    os.mkfifo(run.path(PART))
    with fails_if_blocked(), pytest.raises(ArtifactError, match="a FIFO") as info:
        read_run_table(run, "metrics")
    assert str(run.path(PART)) in info.value.message
