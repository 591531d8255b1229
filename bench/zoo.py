"""The zoo through the whole QAT chain (or, with --ptq, the PTQ chain): one row per model.

    python bench/zoo.py                          # every zoo model, native size, 100 frames
    python bench/zoo.py --small --frames 32      # the reduced input sizes the tests use
    python bench/zoo.py resnet18 mobilenet_v2 --frames 1000
    python bench/zoo.py --ptq --small resnet18   # exported to ONNX, then ``qparity ptq``
    python bench/zoo.py --ptq yolo_head          # examples/onnx_zoo: other exporters' idioms
    python bench/zoo.py --ptq --small dynamo_resnet18   # torch's dynamo exporter instead

Each model runs in its own process (``qparity run`` of a spec made from
examples/zoo/spec.yaml with that model, ``--no-prefect``, the analysis on) so one that
fails prints its error and the others go on. A row: stages completed, top-1 per stage
(agreement with the float model: the zoo's labels are the float model's argmax; output
cosine with the float model for a dataset without labels, e.g. examples/onnx_zoo), the
first divergent stage, and wall time. ``--store DIR`` keeps the runs (default: a
temporary folder); ``--markdown`` prints the table as markdown for examples/zoo/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.onnx_zoo.graphs import BUILDERS, INPUT_SHAPES  # noqa: E402
from examples.zoo.models import ZOO, entry_of  # noqa: E402

QAT = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]
PTQ = ["original", "optimized", "calibrated", "ptq", "quantized", "hbm", "board"]


def spec_for(
    name: str, small: bool, frames: int, ptq: bool, store: Path, shapes: bool = False
) -> dict:
    """examples/zoo/spec.yaml with the model, its dataset and the frame count set; with
    ``ptq`` a PTQ spec whose ``model.export`` writes the model to ONNX first (``shapes``:
    with ``model.input_shapes`` as the vendor's input_shape, ``x: [1, 3, size, size]``).
    A segmentation model's spec (either chain) sets ``data.metric: examples.zoo.data:miou``."""
    exporter, base = ("dynamo_", name[7:]) if name.startswith("dynamo_") else ("", name)
    attr = f"small_{base}" if small else base
    data = {"dataset": f"examples.zoo.data:{attr}", "evaluation_samples": frames}
    if ptq and name in BUILDERS:  # examples/onnx_zoo: graphs in other exporters' idioms
        model = {"file": str(store / f"{name}.onnx"), "export": f"examples.onnx_zoo.export:{name}",
                 "input_shapes": INPUT_SHAPES.get(name, {})}  # fmt: skip
        data = {"dataset": f"examples.onnx_zoo.data:{name}", "evaluation_samples": 32}
        return {"model": model, "data": {**data, "calibration_samples": 64, "batch_size": 16}}
    if ptq:
        attr = exporter + attr
        model = {"file": str(store / f"{attr}.onnx"), "export": f"examples.zoo.onnx_export:{attr}"}
        if shapes:
            size = entry_of(attr.removeprefix("dynamo_"))[1]
            model["input_shapes"] = {"x": [1, 3, size, size]}
        if ZOO[base].task == "segment":  # as the QAT chain's: the class map's mIoU
            data["metric"] = "examples.zoo.data:miou"
        return {"model": model, "data": {**data, "calibration_samples": 64, "batch_size": 16},
                "quant": {"march": "nash-e"}, "tags": {"example": "zoo"}}  # fmt: skip
    spec = yaml.safe_load((ROOT / "examples/zoo/spec.yaml").read_text())
    spec["name"] = f"zoo-{name.replace('_', '-')}"
    spec["model"]["factory"] = f"examples.zoo.models:{attr}"
    spec["data"].update(data)
    if ZOO[name].task == "segment":  # no labels: the class map's mIoU against the float one
        spec["data"]["metric"] = "examples.zoo.data:miou"
    return spec


def run_one(
    name: str, small: bool, frames: int, store: Path, ptq: bool, shapes: bool = False
) -> dict:
    """One model through ``qparity run`` (or ``qparity ptq``); its row (stages, top-1s,
    divergence, time)."""
    spec = spec_for(name, small, frames, ptq, store, shapes)
    spec_path = store / f"{name}{'-ptq' if ptq else ''}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    roots = os.pathsep.join(filter(None, [os.environ.get("QPARITY_ALLOWED_ROOTS"), str(store)]))
    env = dict(os.environ, QPARITY_ZOO_FRAMES=str(frames), QPARITY_ALLOWED_ROOTS=roots)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "qparity.cli", "ptq" if ptq else "run", str(spec_path),
         "--no-prefect", "-q", "--runs", str(store)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    row = {"model": name, "seconds": time.perf_counter() - t0, "error": None}
    prefix = Path(spec["model"]["file"]).stem if ptq else spec["name"]
    row.update(_results(store, prefix, PTQ if ptq else QAT))
    if proc.returncode != 0:
        text = " ".join((proc.stderr + proc.stdout).split())
        start = text.find("error")
        row["error"] = text[start : start + 300] if start >= 0 else f"exit {proc.returncode}"
    return row


def _results(store: Path, spec_name: str, stages: list[str]) -> dict:
    """Per-stage top-1 and the first divergent stage of the newest run of ``spec_name``."""
    import duckdb

    runs = sorted(p for p in store.glob(f"{spec_name}-*") if p.is_dir())
    if not runs:
        return {"top1": {}, "completed": 0, "diverges": "-", "metric": "top1"}
    run = runs[-1]
    manifest = json.loads((run / "manifest.json").read_text())
    done = [s for s in stages if manifest.get("stages", {}).get(s, {}).get("status") == "complete"]
    rows = duckdb.sql(
        f"SELECT metric, stage, value FROM read_parquet('{run}/tables/metrics/**/*.parquet') "
        "WHERE metric IN ('top1', 'cosine')"
    ).fetchall() if (run / "tables/metrics").exists() else []  # fmt: skip
    metric = "top1" if any(m == "top1" for m, _, _ in rows) else "cosine"  # no labels: cosine
    metrics: dict[str, float] = {}  # several outputs: the worst one's
    for m, stage, value in rows:
        if m == metric:
            metrics[stage] = min(metrics.get(stage, value), value)
    loc = run / "tables/localization"
    diverges = "-"
    if loc.exists():
        rows = duckdb.sql(
            f"SELECT stage FROM read_parquet('{loc}/**/*.parquet') "
            "WHERE kind = 'stage' AND rank = 1 LIMIT 1"
        ).fetchall()
        diverges = rows[0][0] if rows else "none"
    return {"top1": metrics, "completed": len(done), "diverges": diverges, "metric": metric}


def render(rows: list[dict], markdown: bool, stages: list[str]) -> str:
    cols = ["float", *stages] if stages is QAT else stages
    head = ["model", "stages", *cols, "first divergent", "time"]
    lines = []
    for r in rows:
        digits = 4 if r["metric"] == "cosine" else 3
        t1 = [f"{r['top1'][c]:.{digits}f}" if c in r["top1"] else "-" for c in cols]
        cells = [
            r["model"],
            f"{r['completed']}/{len(stages)}",
            *t1,
            r["diverges"],
            f"{r['seconds']:.0f} s",
        ]
        lines.append(cells)
        if r["error"]:
            lines.append([f"  error: {r['error']}"] + [""] * (len(head) - 1))
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(c) + " |" for c in lines if c[1]])
    table = [head, *(x for x in lines if x[1])]  # error lines do not set the widths
    widths = [max(len(str(x[i])) for x in table) for i in range(len(head))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(x, widths, strict=True)).rstrip()
        for x in [head, *lines]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="zoo names (default: all)")
    ap.add_argument("--frames", type=int, default=100, help="evaluation frames per model")
    ap.add_argument("--small", action="store_true", help="the reduced input sizes")
    ap.add_argument("--store", type=Path, help="keep the runs here")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--ptq", action="store_true", help="export to ONNX, run the PTQ chain")
    ap.add_argument("--input-shapes", action="store_true",
                    help="PTQ: set model.input_shapes to [1, 3, size, size] (the vendor's "
                    "input_shape): size computations left by the exporter fold")  # fmt: skip
    args = ap.parse_args()
    names = args.models or [n for n in ZOO if not args.small or ZOO[n].small]
    names += [] if args.models or not args.ptq else sorted(BUILDERS)
    store = args.store or Path(tempfile.mkdtemp(prefix="qparity-zoo-"))
    store.mkdir(parents=True, exist_ok=True)
    stages = PTQ if args.ptq else QAT
    print(f"# zoo ({'PTQ' if args.ptq else 'QAT'} chain): {len(names)} models, {args.frames} evaluation frames, "
          f"{'reduced' if args.small else 'native'} input size, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}; runs in {store}", flush=True)  # fmt: skip
    rows = []
    for name in names:
        rows.append(run_one(name, args.small, args.frames, store, args.ptq, args.input_shapes))
        print("\n".join(render(rows[-1:], False, stages).splitlines()[1:]), flush=True)
    print()
    print(render(rows, args.markdown, stages))


if __name__ == "__main__":
    main()
