"""Crash safety: SIGKILL a run at random points, rerun the same spec, check the store.

Each trial starts ``qparity run SPEC --no-prefect`` in a subprocess and kills it with
SIGKILL, either after a random delay or (every other trial) inside its N-th atomic write
(schemas.fileio's crash hook: after the data is written, before the rename). Then the same
spec runs again in the same store and must complete; afterwards the store must hold:
valid manifests, no crashed run marked complete, every complete run's artifacts verifying
their digests, no temp file taken for a real one, and no duplicate rows in the stages,
metrics and runs tables. Prints k/N trials that recovered.

    python bench/crash.py [--trials 20] [--spec tests/catalog/crash_spec.yaml]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.fileio import CRASH_ENV  # noqa: E402
from schemas.store import RunStore  # noqa: E402
from schemas.tables import read_table  # noqa: E402
from stages.registry import BY_NAME  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QPARITY = [sys.executable, "-m", "qparity.cli"]


def start(spec: Path, store: Path, crash_at: int | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if crash_at is not None:
        env[CRASH_ENV] = str(crash_at)
    cmd = [*QPARITY, "run", str(spec), "--runs", str(store), "--no-prefect", "--quiet"]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def kill_after(proc: subprocess.Popen, delay: float) -> None:
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def check_store(root: Path) -> list[str]:
    """Problems in the store (empty: healthy)."""
    store, problems = RunStore(root), []
    for m in store.list_runs():
        if m.status != "complete":
            continue
        run = store.open(m.run_id)
        for stage in m.stages:
            try:
                run.load_artifact(stage, BY_NAME[stage].output)
            except Exception as e:  # any failure to verify is a finding, reported
                problems.append(f"{m.run_id}/{stage}: {e}")
    for table, key in (("runs", ("run_id",)), ("stages", ("run_id", "stage")),
                       ("metrics", ("run_id", "stage", "metric"))):  # fmt: skip
        rows = read_table(root, table).to_pylist()
        dup = [k for k, n in Counter(tuple(r[c] for c in key) for r in rows).items() if n > 1]
        problems += [f"duplicate {table} row {k}" for k in dup]
    return problems


def trial(spec: Path, store: Path, rng: random.Random, i: int, total_s: float, writes: int):
    """One kill + rerun; returns (recovered, where it was killed, problems)."""
    if i % 2:
        at = rng.randint(1, writes)
        proc, where = start(spec, store, at), f"inside write {at}/{writes}"
        proc.wait()
    else:
        delay = rng.uniform(0.5, total_s)
        proc, where = start(spec, store, None), f"after {delay:.1f} s"
        kill_after(proc, delay)
    again = subprocess.run([*QPARITY, "run", str(spec), "--runs", str(store), "--no-prefect",
                            "--quiet"], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    problems = check_store(store)
    if again.returncode != 0:
        problems.append(f"rerun failed: {again.stderr.strip()[-300:]}")
    return not problems, where, problems


def calibrate_run(spec: Path, store: Path) -> tuple[float, int]:
    """Wall time and number of atomic writes of one clean run (sets the kill range)."""
    t0 = time.perf_counter()
    proc = start(spec, store, None)
    proc.wait()
    return time.perf_counter() - t0, _count_writes(store)


def _count_writes(store: Path) -> int:
    files = [p for p in store.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return max(len(files), 10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--spec", type=Path, default=ROOT / "tests/catalog/crash_spec.yaml")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    probe = Path(tempfile.mkdtemp(prefix="qparity-crash-probe-"))
    total_s, writes = calibrate_run(args.spec, probe)
    print(f"clean run: {total_s:.1f} s, about {writes} files written", flush=True)
    ok = 0
    for i in range(args.trials):
        store = Path(tempfile.mkdtemp(prefix="qparity-crash-"))
        good, where, problems = trial(args.spec, store, rng, i, total_s, writes)
        ok += good
        print(f"{i + 1:3d} killed {where:<22} {'recovered' if good else 'FAILED'} "
              f"{'; '.join(problems)[:300]}", flush=True)  # fmt: skip
    print(f"\nrecovered {ok}/{args.trials}")


if __name__ == "__main__":
    main()
