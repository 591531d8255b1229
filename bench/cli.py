"""Start-up of the data commands against plain python + duckdb on the same store.

Each command runs in its own process (what a user's shell does), in rounds that run every
command once in turn; a command's time is the median over the rounds (wall clock of the
whole process, ``time.perf_counter`` around ``subprocess.run``):

- ``qparity sql "SELECT * FROM first_divergences"`` against the anchor, a python process
  that imports duckdb and reads the same Parquet files (``read_parquet`` of every run's
  localization table);
- ``qparity runs``, ``qparity show RUN``, ``qparity --help`` against a python process that
  imports duckdb and nothing else.
The ratio is command / anchor (target: at most 2). The store must hold runs:

    python bench/cli.py --store runs [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed: {proc.stderr.strip()[-300:]}")
    return took


def commands(store: Path) -> dict[str, list[str]]:
    """Name -> argv of every process timed."""
    py, cli = sys.executable, [sys.executable, "-m", "qparity.cli"]
    run = next(p.name for p in sorted(store.iterdir()) if (p / "manifest.json").is_file())
    parts = f"{store}/*/tables/localization/**/*.parquet"
    plain = f"import duckdb; duckdb.sql(\"SELECT * FROM read_parquet('{parts}', union_by_name=true)\").fetchall()"  # noqa: E501
    return {
        "anchor: python + duckdb query": [py, "-c", plain],
        "anchor: python + import duckdb": [py, "-c", "import duckdb"],
        "qparity sql first_divergences": [
            *cli,
            "sql",
            "SELECT * FROM first_divergences",
            "--runs",
            str(store),
            "-q",
        ],  # fmt: skip
        "qparity runs": [*cli, "runs", "--runs", str(store), "-q"],
        f"qparity show {run}": [*cli, "show", run, "--runs", str(store)],
        "qparity --help": [*cli, "--help"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=Path("runs"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cmds = commands(args.store.resolve())
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(args.rounds):
        for name, argv in cmds.items():
            times[name].append(_timed(argv))
    med = {k: statistics.median(v) for k, v in times.items()}
    n_runs = sum(1 for p in args.store.iterdir() if (p / "manifest.json").is_file())
    print(f"# {n_runs} runs in {args.store}; median of {args.rounds} rounds; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    query, bare = med["anchor: python + duckdb query"], med["anchor: python + import duckdb"]
    for name, t in med.items():
        anchor = query if name.startswith("qparity sql") else bare
        ratio = "" if name.startswith("anchor") else f"  {t / anchor:.2f}x the anchor"
        print(f"{name:<58} {t:6.2f} s{ratio}")


if __name__ == "__main__":
    main()
