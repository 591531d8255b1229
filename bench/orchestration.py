"""What the orchestration layer costs: Prefect per stage, the cache, Dask workers.

(a) run_chain with and without the Prefect flow on the same spec, cold (empty store) and
fully cached (every stage a cache hit), per-stage overhead = wall difference / stages;
(b) the demo's wall time cold vs fully cached (both with Prefect); (c) an 8-run sweep
(consistency level x march) on a LocalCluster of 1 vs 2 Dask workers, each into an empty
store, against a Prefect server the bench starts on 127.0.0.1 (docs/environment.md,
"Prefect": without one every worker starts its own temporary server); (d) the run store at an fsspec URL: the same chain
(direct calls) into a local folder vs ``s3://`` on moto's S3 server on 127.0.0.1, cold and
cached, interleaved. The server is local, so (d) is the mirror's sync cost (listing,
uploading, downloading), not a real network's latency.

    python bench/orchestration.py [--spec examples/digits/spec.yaml] [--rounds 3] [--no-dask]
                                  [--no-s3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines.flow import prefect_ready, run_chain  # noqa: E402
from pipelines.sweep import run_sweep  # noqa: E402
from schemas.spec import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _chain(spec_path: Path, root: Path, use_prefect: bool) -> tuple[float, int, bool]:
    """(wall s, stages, all cache hits) of one run; Prefect API start-up excluded."""
    spec = load_spec(spec_path)
    result = run_chain(spec, spec_path.read_text(), root, use_prefect=use_prefect)
    hits = all(o.cache_hit for o in result.outcomes.values())
    return result.wall_s, len(result.outcomes), hits


def bench_chain(spec_path: Path, rounds: int) -> list[tuple[str, float, str]]:
    """Rows (what, seconds, note) of (a) and (b)."""
    prefect_ready()  # the temporary server's start-up is not per-stage overhead
    tmp = Path(tempfile.mkdtemp(prefix="bench-orch-"))
    cold_plain, n, _ = _chain(spec_path, tmp / "plain", False)
    cold_flow, _, _ = _chain(spec_path, tmp / "flow", True)
    warm = {False: [], True: []}
    for _ in range(rounds):  # interleaved, both on the warm "flow" store
        for use in (False, True):
            wall, _, hits = _chain(spec_path, tmp / "flow", use)
            assert hits, "a warm run recomputed a stage"
            warm[use].append(wall)
    plain, flow = statistics.median(warm[False]), statistics.median(warm[True])
    return [
        ("stages in the chain", n, ""),
        ("cold, direct calls (s)", cold_plain, "empty store"),
        ("cold, Prefect flow (s)", cold_flow, "empty store (demo cold)"),
        ("cold Prefect overhead per stage (s)", (cold_flow - cold_plain) / n, "noisy: 1 run"),
        ("cached, direct calls (s)", plain, f"median of {rounds}"),
        ("cached, Prefect flow (s)", flow, f"median of {rounds} (demo cached)"),
        ("cached Prefect overhead per stage (s)", (flow - plain) / n, ""),
        ("Prefect / direct, cached", flow / plain, "ratio"),
        ("demo cold / cached (Prefect)", cold_flow / flow, "ratio"),
    ]


def bench_dask(spec_path: Path) -> list[tuple[str, float, str]]:
    """Rows of (c): the same 8 runs on 1 and on 2 workers, each into an empty store."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.pipelines.test_sweep import _server, _stop

    proc, url = _server()
    tmp, rows = Path(tempfile.mkdtemp(prefix="bench-sweep-")), []
    try:
        with temporary_settings({PREFECT_API_URL: url}):
            for workers in (1, 2):
                sweep = {
                    "name": f"bench-{workers}w",
                    "spec": str(spec_path.resolve()),
                    "matrix": {
                        "quant.consistency_level": ["none", 0, 1, 2],
                        "quant.march": ["nash-e", "nash-m"],
                    },
                    "runner": {"kind": "dask", "workers": workers},
                }
                path = tmp / f"sweep{workers}.yaml"
                path.write_text(yaml.safe_dump(sweep))
                t0 = time.perf_counter()
                result = run_sweep(path, tmp / f"runs{workers}")
                ok = len(result.runs) - len(result.failed)
                rows.append((f"8-run sweep, {workers} worker(s) (s)", time.perf_counter() - t0,
                             f"{ok}/8 complete"))  # fmt: skip
    finally:
        _stop(proc)
    rows.append(("sweep 1 worker / 2 workers", rows[0][1] / rows[1][1], "speed-up"))
    return rows


def bench_store(spec_path: Path, rounds: int) -> list[tuple[str, float, str]]:
    """Rows of (d): local folder vs s3:// (moto on 127.0.0.1), cold then cached, per round
    a fresh store and a fresh mirror."""
    import logging
    import os

    import fsspec.config
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    fsspec.config.conf.setdefault("s3", {})["endpoint_url"] = f"http://{host}:{port}"
    fs, _ = fsspec.core.url_to_fs("s3://bench")
    fs.mkdir("bench")
    tmp, times = Path(tempfile.mkdtemp(prefix="bench-store-")), {}
    try:
        for r in range(rounds):
            os.environ["QPARITY_MIRROR"] = str(tmp / f"mirror{r}")
            for kind, root in (("local", tmp / f"local{r}"), ("s3", f"s3://bench/runs{r}")):
                for phase in ("cold", "cached"):
                    times.setdefault((kind, phase), []).append(_chain(spec_path, root, False)[0])
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    return [(f"{phase}, {kind} store, direct calls (s)", med[(kind, phase)], f"median of {rounds}")
            for phase in ("cold", "cached") for kind in ("local", "s3")] + [
        ("s3 / local, cold", med[("s3", "cold")] / med[("local", "cold")], "ratio"),
        ("s3 / local, cached", med[("s3", "cached")] / med[("local", "cached")], "ratio"),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "digits" / "spec.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--no-s3", action="store_true")
    args = ap.parse_args()
    rows = bench_chain(args.spec, args.rounds)
    if not args.no_s3:
        rows += bench_store(args.spec, args.rounds)
    if not args.no_dask:
        rows += bench_dask(args.spec)
    print(f"\norchestration bench, spec {args.spec}")
    print(f"| {'measure':<40} | {'value':>9} | note |\n|{'-' * 42}|{'-' * 11}|------|")
    for what, value, note in rows:
        print(f"| {what:<40} | {value:>9.3f} | {note} |")


if __name__ == "__main__":
    main()
