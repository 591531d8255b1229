"""The simulator and onnxruntime's int8 path at one batch in four cache states, side by side:
where bench/simulator.py's batch-1 time goes beyond the kernels' own.

bench/simulator.py times every engine after ``sim_probe.settle`` (the process's threads idle,
up to 40 ms after onnxruntime's run). On a shared host the last-level cache is refilled by
other tenants meanwhile, so each timed run reads its weights from memory again. This script
times both engines of a model (the chain up to compile as bench/simulator.py runs it) in:

- ``warm``: the engine run back to back (weights and activations left in the caches);
- ``idle 5 ms`` and ``idle 50 ms``: ``time.sleep`` before each run;
- ``L3 flushed``: more bytes than the last-level cache (``/sys/.../index3/size`` x 1.1)
  touched before each run, no idle: the cold caches alone.

In each state the engines take turns in blocks (all of one engine's rounds, then the
other's, each block after ``sim_probe.settle``), median per engine; the ratio is
ORT int8's time over the simulator's (> 1: the simulator is faster), the anchor being
onnxruntime's int8 QOperator session (:mod:`bench.ort_int8`, ORT_ENABLE_ALL, 2 threads).

    python bench/cache_state.py [--models resnet18 mobilenet_v2 resnet50] [--batch 1]
                                [--rounds 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.sim_probe import settle  # noqa: E402
from bench.simulator import DEFAULT_MODELS, MODELS, engines, run_chain_limited  # noqa: E402

ENGINES = ("sim", "ORT int8")


CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def llc_bytes(cache: Path = CACHE) -> int:
    """The last-level cache's size from sysfs (``index3``, else ``index2``: "491520K",
    "32M"), in bytes; 64 MB when sysfs does not say."""
    for index in ("index3", "index2"):
        p = cache / index / "size"
        if p.exists():
            text = p.read_text().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
            return int(text.rstrip("KM")) * unit
    return 64 << 20


def states() -> dict:
    """What runs before each timed run, per state (module docstring)."""
    junk = np.zeros(int(llc_bytes() * 1.1), np.uint8)
    return {"warm": lambda: None, "idle 5 ms": lambda: time.sleep(0.005),
            "idle 50 ms": lambda: time.sleep(0.05), "L3 flushed": lambda: junk.__iadd__(1)}  # fmt: skip


def time_state(fn, before, rounds: int) -> float:
    """Median seconds of ``fn()`` over ``rounds`` runs, each after ``before()``."""
    fn()
    times = []
    for _ in range(rounds):
        before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def model_rows(name: str, store: Path, batch: int, rounds: int) -> list[tuple]:
    """(state, sim ms, ORT int8 ms) rows of one model."""
    chain = run_chain_limited(name, store, 600.0)
    if "error" in chain:
        raise SystemExit(f"{name}: chain stopped in stage {chain['stage']} ({chain['error']})")
    _, fns, _, _, _ = engines(name, store, chain["run_id"], batch)
    rows = []
    for state, before in states().items():
        ms = {}
        for engine in ENGINES:
            settle()
            ms[engine] = 1e3 * time_state(fns[engine], before, rounds)
        rows.append((state, ms["sim"], ms["ORT int8"]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS), choices=list(MODELS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    store = Path(tempfile.mkdtemp(prefix="qparity-bench-cache-"))
    print(f"# last-level cache {llc_bytes() >> 20} MB; batch {args.batch}; {args.rounds} rounds "
          f"a state; load average {Path('/proc/loadavg').read_text().strip()}", flush=True)  # fmt: skip
    print("| model | state | sim ms | ORT int8 ms | ratio (ORT int8 / sim) |")
    print("|---|---|---|---|---|")
    for name in args.models:
        for state, sim, ort in model_rows(name, store, args.batch, args.rounds):
            print(f"| {name} | {state} | {sim:.2f} | {ort:.2f} | {ort / sim:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
