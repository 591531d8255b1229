"""Each instruction of a model's compiled program on one kernel thread and on two, side by
side: what the second core buys at one batch, and where it is lost.

For each model (the chain up to compile as bench/simulator.py runs it) the simulator runs
back to back with ``QPARITY_THREADS`` 1 and 2 in alternating blocks (``--blocks`` blocks of
``--rounds`` runs each), timing every instruction (``Executor(timings=True)``); each time is
the median over its runs. The anchor of every ratio is the same program on one thread:
ratio = one thread's time / two threads' time (2.0x: the second core doubled the speed;
below 1.0x: two threads lose to one). "lost" is what two threads take beyond half of one
thread's time, the ideal split; summed per instruction kind (bench/sim_report.py).

    python bench/thread_scaling.py [--models mobilenet_v2 resnet18 resnet50] [--batch 1]
                                   [--rounds 100] [--blocks 3] [--top 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.sim_report import instruction_kind  # noqa: E402
from bench.simulator import MODELS, run_chain_limited, sim_engine  # noqa: E402

THREADS = (1, 2)


def time_blocks(run, timings, rounds: int, blocks: int) -> dict[int, dict]:
    """Per thread count: ``{"run": seconds, i: seconds}``, medians over its runs (the
    blocks of each count alternate, so drift hits both; ``QPARITY_THREADS`` is restored
    after). ``run()`` runs the program once, ``timings()`` returns the last run's
    ``(index, op, seconds)`` per instruction."""
    runs = {n: [] for n in THREADS}
    per = {n: {} for n in THREADS}
    before = os.environ.get("QPARITY_THREADS")
    try:
        for _ in range(blocks):
            for n in THREADS:
                os.environ["QPARITY_THREADS"] = str(n)
                run()  # the first run after a switch: untimed
                for _ in range(rounds):
                    runs[n].append(_timed(run))
                    for i, _, s in timings():
                        per[n].setdefault(i, []).append(s)
    finally:
        if before is None:
            os.environ.pop("QPARITY_THREADS", None)
        else:
            os.environ["QPARITY_THREADS"] = before
    return {n: {"run": float(np.median(runs[n])),
                **{i: float(np.median(v)) for i, v in per[n].items()}} for n in THREADS}  # fmt: skip


def _timed(run) -> float:
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


def lost(one: float, two: float) -> float:
    """Seconds two threads take beyond the ideal split of one thread's time."""
    return two - one / 2


def by_kind_rows(times: dict[int, dict], kind_of) -> list[tuple[str, float, float, float]]:
    """(kind, 1-thread s, 2-thread s, lost s) per instruction kind, most lost first."""
    rows: dict[str, list[float]] = {}
    for i, one in times[1].items():
        if i == "run" or i not in times[2]:
            continue
        acc = rows.setdefault(kind_of(i), [0.0, 0.0])
        acc[0] += one
        acc[1] += times[2][i]
    out = [(k, a, b, lost(a, b)) for k, (a, b) in rows.items()]
    return sorted(out, key=lambda r: -r[3])


def model_report(name: str, store: Path, batch: int, args) -> None:
    chain = run_chain_limited(name, store, 600.0)
    if "error" in chain:
        raise SystemExit(f"{name}: chain stopped in stage {chain['stage']} ({chain['error']})")
    x, _, executor, in_name = sim_engine(name, store, chain["run_id"], batch)
    program = executor.program
    times = time_blocks(lambda: executor.run({in_name: x}), lambda: executor.timings,
                        args.rounds, args.blocks)  # fmt: skip
    one, two = times[1]["run"], times[2]["run"]
    print(f"\n## {name}, batch {batch}: whole run {one * 1e3:.2f} ms on one thread, "
          f"{two * 1e3:.2f} ms on two: {one / two:.2f}x (lost {lost(one, two) * 1e3:.2f} ms)")
    print("| instruction kind | 1 thread ms | 2 threads ms | ratio | lost ms |")
    print("|---|---|---|---|---|")

    def kind_of(i: int) -> str:
        return instruction_kind(program.instructions[i], program)

    for kind, a, b, gone in by_kind_rows(times, kind_of):
        print(f"| {kind} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f}x | {gone * 1e3:.3f} |")
    worst = sorted((i for i in times[1] if i != "run" and i in times[2]),
                   key=lambda i: -lost(times[1][i], times[2][i]))[: args.top]  # fmt: skip
    print(f"most lost ({args.top} instructions):")
    for i in worst:
        a, b = times[1][i], times[2][i]
        ins = program.instructions[i]
        print(f"  #{i:<3} {kind_of(i):<16} {a * 1e3:7.3f} -> {b * 1e3:7.3f} ms  {a / b:5.2f}x  "
              f"{','.join(ins.layer_ids)[:50]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=["mobilenet_v2", "resnet18", "resnet50"],
                    choices=list(MODELS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    print(f"# {os.cpu_count()} cores; load {Path('/proc/loadavg').read_text().strip()}; "
          f"anchor: the same program on one kernel thread")
    with tempfile.TemporaryDirectory(prefix="qparity-threads-") as tmp:
        for name in args.models:
            model_report(name, Path(tmp), args.batch, args)


if __name__ == "__main__":
    main()
