"""`qparity sweep`: a line per run as it ends; --quiet: one line per run, nothing else.

The sweep itself is stubbed (tests/pipelines/test_sweep.py runs real ones): these tests are
about what the command prints while and after it runs."""

import sys

import pytest

import pipelines.sweep
from pipelines.sweep import RunRecord, SweepResult
from qparity import cli
from tests.pipelines.test_sweep import SWEEP, write_sweep

RECORDS = [
    RunRecord("level=none", "r-1", "complete", 0.99, "board_sim", None, 1.5),
    RunRecord("level=2", "r-2", "failed", None, None, None, 0.5, "board_sim: refused"),
]


@pytest.fixture
def stub_sweep(monkeypatch):
    """run_sweep reporting each record through on_run, as the real one does; returns, per
    call, whether a progress callback was passed."""
    calls: list[bool] = []

    def fake(path, root, use_prefect=True, on_run=None):
        calls.append(on_run is not None)
        for record in RECORDS:
            if on_run:
                on_run(record)
        return SweepResult("tiny-sweep-1", "prefect, local", list(RECORDS), 2.0)

    monkeypatch.setattr(pipelines.sweep, "run_sweep", fake)
    return calls


def _sweep(monkeypatch, tmp_path, *args) -> int:
    path = write_sweep(tmp_path, SWEEP)
    monkeypatch.setattr(
        sys, "argv", ["qparity", "sweep", str(path), "--runs", str(tmp_path), *args]
    )
    with pytest.raises(SystemExit) as e:
        cli.main()
    return e.value.code


def test_a_sweep_prints_a_line_as_each_run_ends(monkeypatch, capsys, tmp_path, stub_sweep):
    assert _sweep(monkeypatch, tmp_path) == 1  # one run failed
    out = capsys.readouterr().out
    assert f"  [1/4] {RECORDS[0].line()}" in out and f"  [2/4] {RECORDS[1].line()}" in out
    assert "top1 0.9900 (board_sim)" in out and "failed: board_sim: refused" in out
    assert "1 of 2 runs failed" in out  # and the summary table after the progress lines


def test_a_quiet_sweep_prints_one_line_per_run_only(monkeypatch, capsys, tmp_path, stub_sweep):
    assert _sweep(monkeypatch, tmp_path, "--quiet") == 1
    assert capsys.readouterr().out.splitlines() == [r.line() for r in RECORDS]
    assert stub_sweep == [False]  # no progress callback asked for
