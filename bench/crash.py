"""Crash safety: SIGKILL a run at random points, rerun the same spec, check the store.

Each trial starts ``qparity run SPEC`` in a subprocess and kills it with SIGKILL, either
after a random delay or (every other trial) inside its N-th atomic write (schemas.fileio's
crash hook: after the data is written and fsynced, before the rename). Then the same spec
runs again in the same store and must complete; afterwards the store must hold: valid
manifests, every stage marked complete (in the killed run too) verifying its artifact's
digests (so no half-written file under a real name), every table part matching the digest
its manifest records, no run still marked running (the rerun marks the killed one
interrupted, its manifest and its runs row), and no duplicate rows in the stages, metrics
and runs tables. Prints k/N trials that recovered.

Without ``--prefect`` the chain runs as plain calls (``--no-prefect``). With it, as the
Prefect flow: each process starts its own temporary Prefect server (~6 s; its database in
``<store>/prefect-home``, so other users' Prefect state is untouched), and the kill takes
the process's whole session, server included, as a power loss would. Each trial's run
store is ``<store>/trial-NN`` (``--store``, default a new temp folder), kept for a look.

    python bench/crash.py [--trials 20] [--store DIR] [--prefect]
                          [--spec tests/catalog/crash_spec.yaml]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.errors import ArtifactError  # noqa: E402
from schemas.fileio import CRASH_ENV  # noqa: E402
from schemas.store import RunStore  # noqa: E402
from schemas.tables import read_table  # noqa: E402
from stages.registry import BY_NAME  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QPARITY = [sys.executable, "-m", "qparity.cli"]


@dataclass(frozen=True)
class Setup:
    """What every run of the bench shares."""

    spec: Path
    prefect_home: Path | None  # None: runs without Prefect

    def command(self, store: Path) -> list[str]:
        flags = ["--quiet"] if self.prefect_home else ["--no-prefect", "--quiet"]
        return [*QPARITY, "run", str(self.spec), "--runs", str(store), *flags]

    def env(self, crash_at: int | None = None) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop(CRASH_ENV, None)
        if crash_at is not None:
            env[CRASH_ENV] = str(crash_at)
        if self.prefect_home:  # a temporary server per process, state kept in the store
            env.pop("PREFECT_API_URL", None)
            env["PREFECT_HOME"] = str(self.prefect_home)
        return env


def start(setup: Setup, store: Path, crash_at: int | None, err=subprocess.DEVNULL):
    """One run in its own session (its Prefect server too), stdout discarded."""
    return subprocess.Popen(setup.command(store), env=setup.env(crash_at), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True)  # fmt: skip


def rerun(setup: Setup, store: Path) -> str | None:
    """Run the spec again to the end; None if it succeeded, else its stderr's tail."""
    with tempfile.TemporaryFile() as err:
        proc = start(setup, store, None, err)
        kill_after(proc, None)
        err.seek(0)
        return None if proc.returncode == 0 else err.read().decode()[-300:]


def kill_after(proc: subprocess.Popen, delay: float | None) -> None:
    """SIGKILL the run's whole session after ``delay`` s or when the run ends (None), so a
    run that killed itself leaves no Prefect server behind. The run is reaped only after
    the kill: until then its pid, the session's id, cannot be reused by another process."""
    end = None if delay is None else time.monotonic() + delay
    while not _exited(proc.pid) and (end is None or time.monotonic() < end):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _exited(pid: int) -> bool:
    """Whether ``pid`` ended, without reaping it (it stays a zombie holding its pid)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def check_store(root: Path) -> list[str]:
    """Problems in the store (empty: healthy). Every stage marked complete, in the killed
    runs too, must load with every file matching its digest; no run may still say running
    once the rerun ended (the rerun marks the killed one interrupted), in its manifest or
    its runs row; every table part must match the digest its manifest records."""
    store, problems = RunStore(root), []
    for m in store.list_runs():
        run = store.open(m.run_id)
        if m.status == "running":
            problems.append(f"{m.run_id}: still marked running after the rerun")
        for stage in [s for s, entry in m.stages.items() if entry.status == "complete"]:
            try:
                run.load_artifact(stage, BY_NAME[stage].output)
            except Exception as e:  # any failure to verify is a finding, reported
                problems.append(f"{m.run_id}/{stage}: {e}")
    for table, key in (("runs", ("run_id",)), ("stages", ("run_id", "stage")),
                       ("metrics", ("run_id", "stage", "metric"))):  # fmt: skip
        try:
            rows = read_table(root, table).to_pylist()
        except ArtifactError as e:  # a part failing its digest: a finding, not a crash
            problems.append(f"table {table}: {e}")
            continue
        dup = [k for k, n in Counter(tuple(r[c] for c in key) for r in rows).items() if n > 1]
        problems += [f"duplicate {table} row {k}" for k in dup]
        problems += _stale_rows(store, rows) if table == "runs" else []
    return problems


def _stale_rows(store: RunStore, rows: list[dict]) -> list[str]:
    """Runs rows whose status is not their manifest's (a killed run's row says running)."""
    status = {m.run_id: m.status for m in store.list_runs()}
    return [
        f"{r['run_id']}: runs row says {r['status']}, its manifest {status[r['run_id']]}"
        for r in rows
        if r["run_id"] in status and r["status"] != status[r["run_id"]]
    ]


def trial(setup: Setup, store: Path, rng: random.Random, i: int, total_s: float, writes: int):
    """One kill + rerun; returns (recovered, where it was killed, problems)."""
    if i % 2:
        at = rng.randint(1, writes)
        proc, where, delay = start(setup, store, at), f"inside write {at}/{writes}", None
    else:
        delay = rng.uniform(0.5, total_s)
        proc, where = start(setup, store, None), f"after {delay:.1f} s"
    kill_after(proc, delay)
    failed = rerun(setup, store)
    problems = check_store(store) + ([f"rerun failed: {failed.strip()}"] if failed else [])
    return not problems, where, problems


def calibrate_run(setup: Setup, store: Path) -> tuple[float, int]:
    """Wall time and number of atomic writes of one clean run (sets the kill range)."""
    t0 = time.perf_counter()
    proc = start(setup, store, None)
    kill_after(proc, None)
    if proc.returncode != 0:
        sys.exit(f"the clean run failed (exit {proc.returncode}): {' '.join(setup.command(store))}")
    return time.perf_counter() - t0, _count_writes(store)


def _count_writes(store: Path) -> int:
    files = [p for p in store.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return max(len(files), 10)


def _fresh(folder: Path) -> Path:
    """An empty folder (a store left by an earlier bench run is replaced)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--spec", type=Path, default=ROOT / "tests/catalog/crash_spec.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", type=Path, help="folder of the trials' run stores (default: temp)")
    ap.add_argument("--prefect", action="store_true", help="run the chain as the Prefect flow")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = args.store or Path(tempfile.mkdtemp(prefix="qparity-crash-"))
    setup = Setup(args.spec.resolve(), root / "prefect-home" if args.prefect else None)
    total_s, writes = calibrate_run(setup, _fresh(root / "probe"))
    print(f"stores under {root}; {'with' if args.prefect else 'without'} Prefect; clean run: "
          f"{total_s:.1f} s, about {writes} files written", flush=True)  # fmt: skip
    ok = 0
    for i in range(args.trials):
        store = _fresh(root / f"trial-{i + 1:02d}")
        good, where, problems = trial(setup, store, rng, i, total_s, writes)
        ok += good
        print(f"{i + 1:3d} killed {where:<22} {'recovered' if good else 'FAILED'} "
              f"{'; '.join(problems)[:300]}", flush=True)  # fmt: skip
    print(f"\nrecovered {ok}/{args.trials}")


if __name__ == "__main__":
    main()
