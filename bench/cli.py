"""Start-up of the data commands against plain python + duckdb on the same store.

Each command runs in its own process (what a user's shell does), in rounds that run every
command once in turn; a command's time is the median over the rounds (wall clock of the
whole process, ``time.perf_counter`` around ``subprocess.run``, and its CPU time, user +
sys). Each command is compared with its own anchor, a plain python process doing with
duckdb what the command does, and with the bare anchor too:

- ``qparity sql "SELECT * FROM first_divergences"`` against the query anchor, a python
  process that imports duckdb and reads the same Parquet files (``read_parquet`` of every
  run's localization table);
- ``qparity show RUN`` against the show anchor, :data:`SHOW_ANCHOR`: a python script that
  reads the run's manifest with ``json``, its metrics parts with one duckdb query, and
  prints the header, the stages and the metric rows;
- ``qparity runs``, ``qparity --help`` against the bare anchor, a python process that
  imports duckdb and nothing else (every command's ratio to it is printed too);
- three floors, for scale: a python process that imports only the libraries every command
  loads (typer, below 0.29: 0.29 coerces every parameter through pydantic; and rich), one
  that adds what ``qparity sql`` needs (duckdb, which reads the parts and gives the rows printed),
  and one that adds what ``qparity show`` reads with (duckdb, which parses the run's
  parts, and yaml for the run's spec).
The targets (ratio to its own anchor at most 2, under 0.5 s) are judged on CPU time: on
this shared machine the CPU ratio is the steadier estimate of the wall ratio on an idle
one. ``--before TREE`` also times the qparity commands of another checkout (``git archive
<commit> | tar -x -C TREE``) in the same rounds, interleaved, as rows marked "(before)": a
before/after pair on the same load. The store must hold runs; ``--make-store N`` first
fills the store with N clones of its first run, each a distinct run (its own id in the
folder name, the manifest and every table row, fresh table digests; the artifacts
hard-linked), so a 100-run store costs one chain run:

    python bench/cli.py --store runs [--rounds 5] [--before /tmp/tree-at-HEAD~3]
    python bench/cli.py --store /tmp/store100 --make-store 100 --from runs
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_RATIO, TARGET_S = 2.0, 0.5
QUERY_ANCHOR = "anchor of sql: python + duckdb query"
SHOW_ANCHOR_NAME = "anchor of show: python + json + duckdb reading the run"
BARE_ANCHOR = "bare anchor: python + import duckdb"
ANCHORS = {QUERY_ANCHOR: "query", SHOW_ANCHOR_NAME: "show", BARE_ANCHOR: "bare"}
SHOW_ANCHOR = """\
import json
import sys
from pathlib import Path

import duckdb

run = Path(sys.argv[1])
manifest = json.loads((run / "manifest.json").read_text())
print(manifest["run_id"], manifest["status"], manifest["started_at"][:19],
      manifest["spec_digest"][:12], manifest["code_version"])
for name, stage in manifest["stages"].items():
    print(name, stage["status"], f"{stage['duration_s'] or 0:.2f}", stage["cache_hit"])
parts = [str(run / p) for p in manifest["tables"] if p.startswith("tables/metrics/")]
query = "SELECT stage, metric, output, value, n_samples FROM read_parquet($parts)"
for stage, metric, output, value, n in duckdb.execute(query, {"parts": parts}).fetchall():
    print(stage, metric, output or "-", f"{value:.6g}", n)
"""
"""What ``qparity show RUN`` does, in plain python + duckdb: read the run's manifest and
its metrics parts, print them (argv: the run's folder)."""
FRAMEWORK = "import typer, typer.main, rich.console, rich.table"
SQL_LIBS = f"{FRAMEWORK}, duckdb"
SHOW_LIBS = f"{FRAMEWORK}, duckdb, yaml"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(
    argv: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Wall time and CPU time (user + sys) of one process running ``argv`` in ``cwd``."""
    t0, c0 = time.perf_counter(), _cpu()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed: {proc.stderr.strip()[-300:]}")
    return took, cpu


def commands(store: Path) -> dict[str, list[str]]:
    """Name -> argv of every process timed."""
    py, cli = sys.executable, [sys.executable, "-m", "qparity.cli"]
    run = _runs(store)[0].name
    parts = f"{store}/*/tables/localization/**/*.parquet"
    plain = f"import duckdb; duckdb.sql(\"SELECT * FROM read_parquet('{parts}', union_by_name=true)\").fetchall()"  # noqa: E501
    return {
        QUERY_ANCHOR: [py, "-c", plain],
        SHOW_ANCHOR_NAME: [py, "-c", SHOW_ANCHOR, str(store / run)],
        BARE_ANCHOR: [py, "-c", "import duckdb"],
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
        "floor: python + typer + rich": [py, "-c", FRAMEWORK],
        "floor of qparity sql: the above + duckdb": [py, "-c", SQL_LIBS],
        "floor of qparity show: the above + duckdb + yaml": [py, "-c", SHOW_LIBS],
    }


def _runs(store: Path) -> list[Path]:
    return [p for p in sorted(store.iterdir()) if (p / "manifest.json").is_file()]


def _clone_tables(src: Path, dst: Path, run_id: str) -> dict[str, str]:
    """Every table part of ``src`` written under ``dst`` with ``run_id`` in its run_id
    column; returns the parts' sha256 by run-relative path (the manifest's ``tables``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas.fileio import sha256_file

    digests = {}
    for part in sorted((src / "tables").rglob("*.parquet")):
        rel, data = part.relative_to(src), pq.read_table(part)
        if "run_id" in data.column_names:
            ids = pa.array([run_id] * data.num_rows, data.schema.field("run_id").type)
            data = data.set_column(data.column_names.index("run_id"), "run_id", ids)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data, dst / rel)
        digests[rel.as_posix()] = sha256_file(dst / rel)
    return digests


def clone_run(src: Path, store: Path, k: int) -> str:
    """A copy of the run folder ``src`` in ``store`` as a run of its own (new id, started
    ``k`` minutes after ``src``); the non-table files are hard links."""
    manifest = json.loads((src / "manifest.json").read_text())
    started = datetime.fromisoformat(manifest["started_at"]) + timedelta(minutes=k)
    run_id = f"{manifest['name']}-{started:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    dst = store / run_id
    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("tables"))
    tables = _clone_tables(src, dst, run_id)
    (dst / "manifest.json").unlink()  # a hard link to the source's: write a file of its own
    manifest.update(run_id=run_id, started_at=started.isoformat(), tables=tables)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return run_id


def make_store(store: Path, source: Path, n: int) -> None:
    """Fill ``store`` (on the same file system as ``source``) up to ``n`` runs by cloning
    the first run of ``source``."""
    store.mkdir(parents=True, exist_ok=True)
    src = _runs(source)[0]
    for k in range(len(_runs(store)), n):
        clone_run(src, store, k + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=Path("runs"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--make-store", type=int, metavar="N", help="first clone runs up to N")
    ap.add_argument("--from", dest="source", type=Path, help="the store to clone from")
    ap.add_argument("--before", type=Path, metavar="TREE", help="also time TREE's commands")
    ap.add_argument("--bytecode", action="store_true", help=BYTECODE_HELP)
    args = ap.parse_args()
    if args.make_store:
        make_store(args.store, args.source or args.store, args.make_store)
    cmds = {k: (v, ROOT) for k, v in commands(args.store.resolve()).items()}
    if args.before:
        mine = [k for k in cmds if k.startswith("qparity")]
        cmds |= {f"{k} (before)": (cmds[k][0], args.before.resolve()) for k in mine}
    load = Path("/proc/loadavg").read_text().strip()
    with tempfile.TemporaryDirectory(prefix="bench-cli-pycache-") as cache:
        samples = sample(cmds, args.rounds, bytecode_env(cache) if args.bytecode else None)
    wall = {k: statistics.median(w for w, _ in v) for k, v in samples.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in samples.items()}
    print(f"# {len(_runs(args.store))} runs in {args.store}; median of {args.rounds} rounds; "
          f"{os.cpu_count()} cores; /proc/loadavg before: {load}, after: "
          f"{Path('/proc/loadavg').read_text().strip()}; "
          f"bytecode: {'written and read (--bytecode)' if args.bytecode else 'as the environment says'}")  # fmt: skip
    report(wall, cpu)


def sample(
    cmds: dict[str, tuple[list[str], Path]], rounds: int, env: dict[str, str] | None
) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) of every command in each of ``rounds`` rounds; with a bytecode ``env``,
    after an untimed round that writes every process's bytecode."""
    for argv, cwd in cmds.values() if env else ():
        _timed(argv, cwd, env)
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
    for _ in range(rounds):
        for name, (argv, cwd) in cmds.items():
            samples[name].append(_timed(argv, cwd, env))
    return samples


BYTECODE_HELP = (
    "run every process (anchors included) with Python's bytecode cache in a temporary "
    "folder, written by one untimed round: as an installed qparity runs (pip compiles it). "
    "Without it, a PYTHONDONTWRITEBYTECODE=1 environment compiles qparity's modules at "
    "every start (~30 ms of show's CPU), which no anchor pays (they import only compiled "
    "site-packages)"
)


def bytecode_env(cache: str) -> dict[str, str]:
    """This environment with bytecode written to and read from ``cache``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | {"PYTHONPYCACHEPREFIX": cache}


def anchor_of(name: str) -> str:
    """The anchor a process is judged against: the duckdb query for sql, the run's read
    for show, bare duckdb otherwise."""
    if "qparity sql" in name:
        return QUERY_ANCHOR
    return SHOW_ANCHOR_NAME if "qparity show" in name else BARE_ANCHOR


def report(wall: dict[str, float], cpu: dict[str, float]) -> None:
    """Each process's median wall and CPU (user + sys) time, its ratios to its own anchor
    and to the bare one, and PASS/MISS of its CPU time against the targets."""
    print(f"{'process':<60} {'wall':>6} {'cpu':>6}  {'anchor':<6} {'ratio wall/cpu':>14}"
          f"  {'bare wall/cpu':>13}  <= {TARGET_RATIO:g}x  < {TARGET_S} s")  # fmt: skip
    for name in wall:
        row = f"{name:<60} {wall[name]:5.2f}s {cpu[name]:5.2f}s"
        if name in ANCHORS:
            print(row)
            continue
        anchor = anchor_of(name)
        own = f"{wall[name] / wall[anchor]:5.2f}x/{cpu[name] / cpu[anchor]:5.2f}x"
        bare = f"{wall[name] / wall[BARE_ANCHOR]:5.2f}x/{cpu[name] / cpu[BARE_ANCHOR]:5.2f}x"
        row += f"  {ANCHORS[anchor]:<6} {own:>14}  {bare:>13}"
        if not name.startswith("floor"):
            ok = cpu[name] / cpu[anchor] <= TARGET_RATIO, cpu[name] < TARGET_S
            row += "".join(f"  {'PASS' if v else 'MISS':>6}" for v in ok)
        print(row)
    print("ratio: to its own anchor (column anchor: query for sql, show for show, bare for "
          "the others); bare: to python + import duckdb; PASS/MISS on CPU time")  # fmt: skip


if __name__ == "__main__":
    main()
