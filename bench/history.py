"""The named queries of analysis/sql over a synthetic store of many runs.

Writes a temporary run store of ``--runs`` runs (default 1,000) laid out like real runs
(``<run>/tables/<table>/<part>.parquet``: one part per stage for stages and metrics, one
per stage pair for layer_stats), with pyarrow directly (no manifests: SQL needs none),
then times each named query (median of ``--rounds``, connection and file discovery
included) and prints a table. Target (issue #6): first_divergence over all runs < 1 s.

    python bench/history.py [--runs 1000] [--layers 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.diff import diff_runs  # noqa: E402
from analysis.query import named  # noqa: E402
from schemas.spec_sections import STAGE_NAMES  # noqa: E402
from schemas.table_schemas import SCHEMAS  # noqa: E402

MODELS = ("digits-cnn", "transformer", "resnet18", "colour-net")
OPS = ("Conv", "Gemm", "Add", "Relu", "MaxPool", "Lut", "Softmax", "LayerNorm", "Mul")
PAIRS = (("qat", "export"), ("export", "convert"), ("convert", "board_sim"))


def _write(folder: Path, table: str, part: str, columns: dict) -> None:
    schema, n = SCHEMAS[table].arrow, len(columns["run_id"])
    arrays = [
        pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in schema
    ]
    data = pa.Table.from_arrays(arrays, schema=schema)
    folder = folder / "tables" / table
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, folder / f"{part}.parquet")


def _none(n: int) -> list[None]:
    return [None] * n


def _layer_stats(run_id: str, rng: np.random.Generator, layers: int, ops: list[str]) -> dict:
    """Aggregate rows (sample_id null) of every stage pair, one dict of columns per pair."""
    out = {}
    for base, analysis in PAIRS:
        err = rng.gamma(1.0, 0.3 if analysis != "convert" else 1.5, layers)
        out[(base, analysis)] = {
            "run_id": [run_id] * layers,
            "base_stage": [base] * layers,
            "analysis_stage": [analysis] * layers,
            "layer_id": [f"l{i:03d}" for i in range(layers)],
            "op_type": ops,
            "topo_index": list(range(layers)),
            "dtype": ["int8"] * layers,
            "scale": (rng.random(layers) * 0.05 + 0.001).tolist(),
            "sample_id": _none(layers),
            "aggregate": ["all"] * layers,
            "n_elements": [4096] * layers,
            "cosine": (1 - rng.random(layers) * 1e-3).tolist(),
            "mse": (err * 1e-4).tolist(),
            "max_qscale_diff": err.round().tolist(),
            "exact_ratio": (1 - rng.random(layers) * 0.01).tolist(),
        }
    return out


def _localization(run_id: str, stage: str | None, layer: int, ops: list[str]) -> dict:
    if stage is None:
        return {"run_id": [run_id], "kind": ["triage"], "rank": [1], "detail": ["consistent"]}
    base = STAGE_NAMES[STAGE_NAMES.index(stage) - 1]
    return {
        "run_id": [run_id] * 3,
        "kind": ["stage", "layer", "sensitive"],
        "rank": [1, 1, 1],
        "stage": [stage] * 3,
        "base_stage": [base] * 3,
        "layer_id": [None, f"l{layer:03d}", f"l{layer:03d}"],
        "op_type": [None, ops[layer], ops[layer]],
        "metric": ["top1", "max_qscale_diff", "top1"],
        "value": [0.9, 3.0, 0.01],
        "threshold": [0.005, 1.0, None],
    }


def make_store(root: Path, n_runs: int, layers: int, seed: int = 0) -> list[str]:
    """Write ``n_runs`` synthetic runs under ``root``; return their ids, oldest first."""
    rng = np.random.default_rng(seed)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ids = []
    for i in range(n_runs):
        run_id, model = f"run-{i:05d}", MODELS[i % len(MODELS)]
        start = t0 + timedelta(hours=i)
        folder = root / run_id
        ops = [OPS[j] for j in rng.integers(0, len(OPS), layers)]
        settings = {"rounding": ["bpu_round", "half_even"][i % 2], "level": str(i % 3)}
        _write(folder, "runs", "run", {
            "run_id": [run_id], "started_at": [start], "finished_at": [start + timedelta(minutes=5)],
            "status": ["complete"], "spec_digest": [f"{i % 17:064x}"], "model": [model],
            "march": ["nash-e"], "consistency_level": [str(i % 3)],
            "settings": [json.dumps(settings)], "code_version": [f"0.1.{i // 100}"], "tags": ["{}"],
        })  # fmt: skip
        top1 = 0.98 - np.cumsum(rng.random(len(STAGE_NAMES)) * 0.004)
        for k, stage in enumerate(STAGE_NAMES):
            _write(folder, "stages", stage, {
                "run_id": [run_id], "stage": [stage], "status": ["complete"],
                "started_at": [start + timedelta(seconds=10 * k)],
                "finished_at": [start + timedelta(seconds=10 * k + 9)], "duration_s": [9.0],
                "artifact_digest": [f"{(i // 3) * 10 + k:064x}"], "cache_hit": [bool(i % 3)],
            })  # fmt: skip
            _write(folder, "metrics", stage, {
                "run_id": [run_id], "stage": [stage], "metric": ["top1"],
                "value": [float(top1[k])], "n_samples": [1000],
            })  # fmt: skip
        for (base, analysis), cols in _layer_stats(run_id, rng, layers, ops).items():
            _write(folder, "layer_stats", f"{base}--{analysis}", cols)
        stage = None if i % 5 == 0 else PAIRS[int(rng.integers(0, 3))][1]
        _write(folder, "localization", "localize", _localization(run_id, stage, i % layers, ops))
        ids.append(run_id)
    return ids


def _time(fn, rounds: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(rounds):
        t = time.perf_counter()
        rows = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qparity-history-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        ids = make_store(root, args.runs, args.layers)
        n_files = sum(1 for _ in root.rglob("*.parquet"))
        print(f"store: {args.runs} runs, {n_files} parquet files, {time.perf_counter() - t:.1f} s")
        a, b = ids[-2], ids[-1]
        cases = {
            "first_divergence": lambda: named(root, "first_divergence").num_rows,
            "model_history": lambda: named(root, "model_history", model=MODELS[0]).num_rows,
            "convert_error_ops": lambda: named(root, "convert_error_ops", stage="convert").num_rows,
            "stage_metrics": lambda: named(root, "stage_metrics").num_rows,
            "layer_stats_pair": lambda: (
                named(
                    root,
                    "layer_stats_pair",
                    run_id=a,
                    base_stage="export",
                    analysis_stage="convert",
                ).num_rows
            ),
            "runs_by_id": lambda: named(root, "runs_by_id", ids=[a, b]).num_rows,
            "diff_runs (4 run_diff_*)": lambda: sum(
                t.num_rows for t in diff_runs(root, a, b).values()
            ),
        }
        print(f"\n| query | rows | median of {args.rounds} (s) |\n|---|---|---|")
        results = {}
        for name, fn in cases.items():
            results[name], rows = _time(fn, args.rounds)
            print(f"| {name} | {rows} | {results[name]:.3f} |")
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nload average while timing (1/5/15 min, {os.cpu_count()} cores): {load}")
        verdict = "PASS" if results["first_divergence"] < 1.0 else "MISS"
        print(f"\nTarget first_divergence < 1 s: {verdict} ({results['first_divergence']:.3f} s)")


if __name__ == "__main__":
    main()
