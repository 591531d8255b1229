"""Peak memory of the per-layer comparison must not grow with the number of samples.

Runs the digits chain once per frame count (100 and 1000 evaluation frames), then, in a
fresh process each, the analysis of that run (every stage pair compared layer by layer,
streamed batch by batch); prints the analysis's wall time and the growth of its peak
traced Python/numpy memory (tracemalloc) and of the process's peak RSS.

    python bench/compare_memory.py [--frames 100 1000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples/digits/spec.yaml"


def measure(root: str, run_id: str) -> dict:
    """(in this process) analyse one run; wall time and peak memory."""
    import resource
    import time
    import tracemalloc

    from analysis.analyze import analyze
    from schemas.spec import load_spec
    from schemas.store import RunStore
    from stages.context import RunContext

    run = RunStore(root).open(run_id)
    ctx = RunContext(spec=load_spec(run.path("spec.yaml")), run=run, code_version="")
    assert ctx.splits["evaluation"] is not None  # load the data before measuring
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    t0 = time.perf_counter()
    analyze(ctx)
    wall = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"wall_s": wall, "traced_peak_mb": peak / 2**20, "rss_growth_mb": (rss - before) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, nargs="*", default=[100, 1000])
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    from pipelines.flow import run_chain
    from schemas.spec import load_spec, with_overrides

    root = tempfile.mkdtemp(prefix="qparity-mem-")
    print(f"{'frames':>7}{'analysis s':>12}{'traced peak MB':>16}{'RSS growth MB':>15}")
    for n in args.frames:
        spec = with_overrides(
            load_spec(SPEC), [f"data.evaluation_samples={n}", "compare.enabled=false"]
        )
        run_id = run_chain(spec, SPEC.read_text(), Path(root), use_prefect=False).run_id
        cmd = [sys.executable, __file__, "--measure", root, run_id]
        m = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        print(f"{n:>7}{m['wall_s']:>12.1f}{m['traced_peak_mb']:>16.1f}{m['rss_growth_mb']:>15.1f}")


if __name__ == "__main__":
    main()
