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

from bench.sim_report import by_kind, instruction_kind  # noqa: E402
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


def instructions(times: dict[int, dict]) -> dict[int, tuple[float, float]]:
    """Per instruction timed on both thread counts: (1-thread s, 2-thread s)."""
    return {i: (one, times[2][i]) for i, one in times[1].items() if i != "run" and i in times[2]}


def kind_rows(one: dict[str, float], two: dict[str, float]) -> list[tuple]:
    """(kind, 1-thread s, 2-thread s, lost s) from seconds per instruction kind on each
    thread count (bench/sim_report.py's ``by_kind``), most lost first."""
    rows = [(k, a, two[k], lost(a, two[k])) for k, a in one.items()]
    return sorted(rows, key=lambda r: -r[3])


def model_report(name: str, store: Path, batch: int, args) -> None:
    chain = run_chain_limited(name, store, 600.0)
    if "error" in chain:
        raise SystemExit(f"{name}: chain stopped in stage {chain['stage']} ({chain['error']})")
    x, _, executor, in_name = sim_engine(name, store, chain["run_id"], batch)
    times = time_blocks(lambda: executor.run({in_name: x}), lambda: executor.timings,
                        args.rounds, args.blocks)  # fmt: skip
    one, two = times[1]["run"], times[2]["run"]
    print(f"\n## {name}, batch {batch}: whole run {one * 1e3:.2f} ms on one thread, "
          f"{two * 1e3:.2f} ms on two: {one / two:.2f}x (lost {lost(one, two) * 1e3:.2f} ms)")
    print("| instruction kind | 1 thread ms | 2 threads ms | ratio | lost ms |")
    print("|---|---|---|---|---|")
    pairs, program = instructions(times), executor.program
    sums = [by_kind({i: p[t] for i, p in pairs.items()}, program) for t in (0, 1)]
    for kind, a, b, gone in kind_rows(*sums):
        print(f"| {kind} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f}x | {gone * 1e3:.3f} |")
    print_most_lost(pairs, program, args.top)


def print_most_lost(pairs: dict[int, tuple[float, float]], program, top: int) -> None:
    print(f"most lost ({top} instructions):")
    for i in sorted(pairs, key=lambda i: -lost(*pairs[i]))[:top]:
        (a, b), ins = pairs[i], program.instructions[i]
        print(f"  #{i:<3} {instruction_kind(ins, program):<16} {a * 1e3:7.3f} -> "
              f"{b * 1e3:7.3f} ms  {a / b:5.2f}x  {','.join(ins.layer_ids)[:50]}")


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
