"""Two runs and a sweep of two writing into one store at once (four runs, three
processes), read through DuckDB meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from analysis.query import run_sql
from schemas.store import RunStore
from schemas.tables import read_table
from tests.conftest import tiny_spec_dict

ROOT = Path(__file__).resolve().parents[2]


def test_two_runs_and_a_sweep_at_once_and_a_reader(tmp_path):
    spec = tmp_path / "spec.yaml"
    data = tiny_spec_dict(stages={"stop_after": "pre_export"}, compare={"enabled": False})
    spec.write_text(yaml.safe_dump(data))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "conc",
                "spec": "spec.yaml",
                "matrix": {"quant.rounding": ["half_even", "bpu_round"]},
            }
        )
    )
    store = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "qparity.cli"]
    run = [*cli, "run", str(spec), "--runs", str(store), "--no-prefect", "--quiet"]
    cmds = [run] * 2 + [[*cli, "sweep", str(sweep), "--runs", str(store), "--no-prefect"]]
    procs = [subprocess.Popen(c, env=env, cwd=ROOT, stderr=subprocess.PIPE) for c in cmds]
    reads = 0
    while any(p.poll() is None for p in procs):
        if store.exists():
            run_sql(store, "SELECT count(*) AS n FROM stages")  # never fails mid-write
            reads += 1
        time.sleep(0.2)
    errors = [p.stderr.read().decode()[-500:] for p in procs if p.returncode != 0]
    assert not errors, errors
    runs = RunStore(store).list_runs()
    assert len(runs) == 4 and all(m.status == "complete" for m in runs)
    assert sum("sweep" in m.tags for m in runs) == 2
    rows = read_table(store, "stages").to_pylist()
    assert sorted((r["run_id"], r["stage"]) for r in rows) == sorted(
        (m.run_id, s) for m in runs for s in ("prepare", "calibrate", "pre_export")
    )
    assert reads > 0
