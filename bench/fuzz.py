"""Fuzz the loaders for a bounded number of iterations and count crashes.

Targets (tests/fuzz/targets.py): the spec loader (random YAML-like data), the .hbm loader
(one header value replaced, valid checksum, then the executor), the ONNX importers (a
random structural edit of a tiny run's qat.onnx, run by OnnxRunner and converted). A crash
is any exception that is not one of qparity's own errors.

    python bench/fuzz.py [--iterations 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import yaml  # noqa: E402

from pipelines.flow import run_chain  # noqa: E402
from schemas.spec import parse_spec  # noqa: E402
from simulator.program import hbm  # noqa: E402
from tests.conftest import tiny_spec_dict  # noqa: E402
from tests.fuzz import targets  # noqa: E402
from tests.simulator.program.test_hbm import small_program  # noqa: E402


def tiny_qat_onnx() -> onnx.ModelProto:
    root = Path(tempfile.mkdtemp(prefix="qparity-fuzz-"))
    data = tiny_spec_dict(stages={"stop_after": "export"}, compare={"enabled": False})
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return onnx.load(str(root / result.run_id / "artifacts/export/qat.onnx"))


def cases(name: str, n: int, rng: random.Random):
    """``n`` argument tuples for a target."""
    if name == "spec":
        strat = targets.spec_data()
        return [(strat.example(),) for _ in range(n)]
    if name == "hbm":
        program = small_program()
        leaves = targets._replace_nth(hbm._header(program)[0], -1, None)
        values = [targets.leaves.example() for _ in range(n)]
        return [((rng.randrange(leaves), v), program) for v in values]
    model = tiny_qat_onnx()
    x = np.random.default_rng(0).uniform(-1, 1, (2, 1, 8, 8)).astype(np.float32)
    return [(targets.mutate_onnx(model, rng.randrange(2**31)), x) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2000, help="per target (ONNX: /10)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    fns = {"spec": targets.spec_target, "hbm": targets.hbm_target, "onnx": targets.onnx_target}
    print(f"{'target':<8}{'iterations':>11}{'ok':>7}{'ours':>7}{'crashes':>9}{'s':>8}")
    for name, fn in fns.items():
        n = args.iterations // 10 if name == "onnx" else args.iterations
        t0, tally, crashes = time.perf_counter(), Counter(), Counter()
        for a in cases(name, n, rng):
            got = targets.outcome(fn, *a)
            tally["crash" if got.startswith("CRASH") else got] += 1
            if got.startswith("CRASH"):
                crashes[got[:120]] += 1
        print(f"{name:<8}{n:>11}{tally['ok']:>7}{tally['ours']:>7}{tally['crash']:>9}"
              f"{time.perf_counter() - t0:>8.1f}", flush=True)  # fmt: skip
        for msg, count in crashes.most_common(5):
            print(f"    {count} x {msg}")


if __name__ == "__main__":
    main()
