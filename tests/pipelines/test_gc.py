"""Runs whose process died: every read shows them interrupted; the next run and `qparity gc`
mark them (manifest, stages and runs tables)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from analysis.query import run_sql
from pipelines.gc import mark_interrupted
from pipelines.runs import start_run
from schemas.owner import heartbeat, shown_status
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_table
from tests.conftest import tiny_spec_dict
from tests.models import tiny

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 180


def sleepy():
    """tests.models:tiny after a long sleep: a run of it is killed inside its prepare."""
    time.sleep(DEADLINE_S)
    return tiny()


def _cli(monkeypatch, capsys, *args) -> str:
    from qparity import cli

    monkeypatch.setattr(sys, "argv", ["qparity", *map(str, args)])
    monkeypatch.setattr(cli.out.real(), "_width", 200)  # no wrapped table cells
    with pytest.raises(SystemExit) as e:
        cli.main()
        raise SystemExit(0)
    io = capsys.readouterr()
    assert e.value.code == 0, io.err
    return io.out


def _killed_in_prepare(tmp_path: Path) -> str:
    """The id of a real `qparity run` SIGKILLed while its prepare stage runs."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(model={"factory": f"{__name__}:sleepy"})))
    store = RunStore(tmp_path / "runs")
    cmd = [sys.executable, "-c", "from qparity.cli import main; main()", "run", str(spec),
           "--runs", str(store.root), "--no-prefect", "--quiet"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            runs = store.list_runs()
            if runs and "prepare" in runs[0].stages:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    (m,) = store.list_runs()
    assert m.status == "running" and m.stages["prepare"].status == "running"
    return m.run_id


def test_a_sigkilled_run_reads_interrupted_and_gc_marks_it(tmp_path, monkeypatch, capsys):
    run_id = _killed_in_prepare(tmp_path)
    root = tmp_path / "runs"
    assert f"{run_id} │ interrupted" in _cli(monkeypatch, capsys, "runs", "--runs", root)
    shown = _cli(monkeypatch, capsys, "show", run_id, "--runs", root)
    assert "status=interrupted" in shown and "prepare │ interrupted" in shown
    assert run_sql(root, "SELECT status FROM runs").to_pylist() == [{"status": "interrupted"}]

    assert "1 run marked interrupted" in _cli(monkeypatch, capsys, "gc", "--runs", root)
    m = RunStore(root).open(run_id).manifest()
    assert m.status == "interrupted" and m.stages["prepare"].status == "interrupted"
    assert m.finished_at == m.owner.heartbeat_at and f"process {m.owner.pid}" in m.error
    assert read_table(root, "runs").to_pylist()[0]["status"] == "interrupted"
    (stage,) = read_table(root, "stages").to_pylist()
    assert (stage["stage"], stage["status"]) == ("prepare", "interrupted")
    assert "0 runs marked interrupted" in _cli(monkeypatch, capsys, "gc", "--runs", root)


def _spec():
    data = tiny_spec_dict()
    return parse_spec(data, "t"), yaml.safe_dump(data)


def test_the_next_run_marks_a_run_whose_pid_now_belongs_to_another_process(tmp_path):
    store = RunStore(tmp_path)
    dead = start_run(store, *_spec())
    assert read_table(tmp_path, "runs").to_pylist()[0]["status"] == "running"
    reused = lambda m: m.model_copy(  # noqa: E731 - same pid, another process start
        update={"owner": m.owner.model_copy(update={"process": "another-boot:1"})}
    )
    dead.update_manifest(reused)
    live = start_run(store, *_spec())
    status = {m.run_id: m.status for m in store.list_runs()}
    assert status == {dead.run_id: "interrupted", live.run_id: "running"}
    rows = {r["run_id"]: r["status"] for r in read_table(tmp_path, "runs").to_pylist()}
    assert rows == status
    assert mark_interrupted(store) == []  # the live run (this process) is left alone


def test_a_run_of_another_host_is_interrupted_once_its_heartbeat_is_stale(tmp_path):
    run = start_run(RunStore(tmp_path), *_spec())
    beat = datetime(2026, 1, 1, tzinfo=UTC)
    m = run.manifest().model_copy(
        update={"owner": run.manifest().owner.model_copy(
            update={"host": "elsewhere", "heartbeat_at": beat.isoformat()})}
    )  # fmt: skip
    assert shown_status(m, now=beat + timedelta(minutes=1)) == "running"
    assert shown_status(m, now=beat + timedelta(minutes=11)) == "interrupted"


def test_the_heartbeat_thread_refreshes_a_running_manifest(tmp_path):
    run = start_run(RunStore(tmp_path), *_spec())
    first = run.manifest().owner.heartbeat_at
    deadline = time.monotonic() + 30
    with heartbeat(run.heartbeat, every=0.01):
        while run.manifest().owner.heartbeat_at == first and time.monotonic() < deadline:
            time.sleep(0.01)
    assert run.manifest().owner.heartbeat_at > first
