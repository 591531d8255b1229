"""Proof that localization works: inject random single faults, check what the localizer names.

For each fault (a random kind, stage and layer of a bundled example) the chain reruns from
the faulted stage (upstream stages are cache hits) and the analysis names the first
divergent stage, its first divergent layer and the top sensitive ops. Printed: the share of
faults where the stage is right, the layer is right, the layer is the first sensitive op
(top1), and the layer is in the top 3.
A camera-preprocessing fault has no layer of its own: its layer counts as right when the
triage says "input or preprocessing". Kinds drawn: convert's four, lut_coarsen, calib_scale
(layers with an output quantizer, scale cut to 1/4 or 1/8: the values clip) and, on colour,
preprocess_swap. colour runs its YUV444 variant (trained on what the nv12 camera delivers):
the RGB-trained spec diverges at board_sim by design, so its clean run is no baseline.

Every run (the clean ones too) is also read back through SQL: its row of the
``first_divergences`` view (``qparity sql "SELECT * FROM first_divergences"``) must name the
same (base stage, first divergent stage, first divergent layer) as the localizer did, and a
clean run must have no row (column ``sql=``; the summary counts them and prints each
mismatch with both sides). The summary also counts false alarms: clean runs where some
stage diverges.

    python bench/localization.py [--faults 200] [--frames 300] [--samples 100]
        [--examples digits transformer colour]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.query import run_sql  # noqa: E402
from pipelines.flow import run_chain  # noqa: E402
from schemas.spec import load_spec, with_overrides  # noqa: E402
from schemas.spec_faults import FaultSpec  # noqa: E402
from schemas.store import RunStore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {n: ROOT / f"examples/{n}/spec.yaml" for n in ("digits", "transformer", "colour")}
SETS = {  # colour: the model trained on what its nv12 camera delivers (README: YUV444 variant)
    "colour": [
        "model.factory=examples.colour.model:build_yuv444",
        "data.dataset=examples.colour.data:load_yuv444",
        "data.input_format=yuv444",
        "data.mean=[128.0,128.0,128.0]",
        "data.std=[128.0,128.0,128.0]",
    ]
}
"""Overrides per example: a clean run must be clean, else a fault has nothing to show."""
CONVERT = {
    "bias_drop": (None,),
    "shift_off": (-1, 1),
    "scale_steps": (-4, -2, 2, 4),
    "rounding_flip": (None,),
}
CALIBRATE = (-8, -12)  # output scale / 4, / 8: the layer's values clip
SQL_FIRST = "SELECT * FROM first_divergences WHERE run_id = $run_id"
TAGS = {"bias_drop": ("/bias#",), "shift_off": ("shift#",), "scale_steps": ("mult#", "/ma#")}


def candidates(store: RunStore, run_id: str, example: str) -> list[FaultSpec]:
    """Every fault this example's clean run can take (kind, layer, amount)."""
    run = store.open(run_id)
    model = onnx.load(str(run.path("artifacts/convert/quantized.onnx")))
    names = [i.name for i in model.graph.initializer]
    dtypes = {
        k: v["dtype"]
        for k, v in json.loads(run.path("artifacts/convert/layers.json").read_text()).items()
    }
    out = []
    for kind, amounts in CONVERT.items():
        tags = TAGS.get(kind, ("mult#",))
        layers = sorted({n.split("/")[0] for n in names if "/" in n and any(t in n for t in tags)})
        if kind != "bias_drop":  # an int32 (high precision) output has no requantize to hit
            layers = [lid for lid in layers if dtypes.get(lid) in ("int8", "int16")]
        out += [FaultSpec(kind=kind, layer=lid, amount=a or 1) for lid in layers for a in amounts]
    art = (run.path("artifacts/pre_export/tables.json")).read_text()
    tables = [m["layer_id"] for m in json.loads(art)]
    out += [FaultSpec(kind="lut_coarsen", layer=lid, amount=a) for lid in tables for a in (3, 4)]
    out += [FaultSpec(kind="calib_scale", layer=lid, amount=a)
            for lid in output_quantized(run) for a in CALIBRATE]  # fmt: skip
    if example == "colour":
        out += [FaultSpec(kind="preprocess_swap", amount=a) for a in (0, 1)]
    return out


def output_quantized(run) -> list[str]:
    """The layers with an output quantizer (calib_scale's targets), from calibrate's
    quantizer listing (``<layer>[<role>]: ...`` per quantizer)."""
    lines = run.path("debug/calibrate_quantizers.txt").read_text().splitlines()
    return sorted({ln.split("[output]:")[0] for ln in lines if "[output]:" in ln})


def observable(store: RunStore, clean_id: str, run_id: str, stage: str) -> bool:
    """Whether the fault changed anything the faulted stage computes on the evaluation set."""
    from schemas.tables import read_run_table

    def agg(rid):
        return {
            r["layer_id"]: r["max_abs"]
            for r in read_run_table(store.open(rid), "layer_stats")
            if r["analysis_stage"] == stage and r["sample_id"] is None and r["base_stage"] != stage
        }

    clean, faulted = agg(clean_id), agg(run_id)
    return any(abs(faulted.get(k, 0.0) - v) > 1e-9 for k, v in clean.items())


def judge(analysis, fault: FaultSpec) -> tuple[bool, bool, bool, bool]:
    """(stage right, layer right, layer the first sensitive op, layer in the top 3)."""
    first = analysis.first
    if first is None or first.analysis != fault.stage:
        return False, False, False, False
    if fault.kind == "preprocess_swap":
        ok = "input" in first.triage
        return True, ok, ok, ok
    top3 = [lid for lid, *_ in first.sensitive[:3]]
    return True, first.first_layer == fault.layer, top3[:1] == [fault.layer], fault.layer in top3


def sql_first(root: Path, run_id: str) -> tuple | None:
    """(base, stage, layer) of the run's row in the first_divergences view, as
    `qparity sql "SELECT * FROM first_divergences"` reads it (None: the run has no row)."""
    rows = run_sql(root, SQL_FIRST, {"run_id": run_id}).to_pylist()
    if not rows:
        return None
    return rows[0]["base_stage"], rows[0]["first_stage"], rows[0]["first_layer"]


def localizer_first(analysis) -> tuple | None:
    """(base, stage, layer) the localizer names for the run (None: no stage diverges)."""
    first = analysis.first
    return None if first is None else (first.base, first.analysis, first.first_layer)


def sql_check(store: RunStore, result, mismatches: list) -> str:
    """The per-run column: whether first_divergences names what the localizer named."""
    view, mine = sql_first(store.root, result.run_id), localizer_first(result.analysis)
    if view == mine:
        return "sql=ok"
    mismatches.append((result.run_id, view, mine))
    return "sql=MISMATCH"


def clean_runs(args, store: RunStore, mismatches: list) -> tuple[dict, int]:
    """One clean run per example: (name -> (spec, candidate faults, run id)), false alarms."""
    pools, alarms = {}, 0
    for name in args.examples:
        sets = [f"compare.samples={args.samples}", f"data.evaluation_samples={args.frames}"]
        sets += SETS.get(name, [])
        spec = with_overrides(load_spec(EXAMPLES[name]), sets)
        clean = run_chain(spec, EXAMPLES[name].read_text(), store.root, use_prefect=False)
        pools[name] = (spec, candidates(store, clean.run_id, name), clean.run_id)
        alarms += clean.analysis.first is not None
        verdict = clean.analysis.summary().splitlines()[0].split(": ", 1)[1]
        print(f"{name}: clean run, {len(pools[name][1])} candidate faults; {verdict} "
              f"{sql_check(store, clean, mismatches)}", flush=True)  # fmt: skip
    return pools, alarms


def report(tally: dict, seen: dict, alarms: int, runs: int, mismatches: list, t0: float) -> None:
    """The summary lines: faults, the shares against their targets, false alarms, the view."""
    n, m = max(tally["n"], 1), max(seen["n"], 1)
    print(f"\nfaults {tally['n']} ({seen['n']} with an effect) in {time.perf_counter() - t0:.0f} s")
    print(f"{'':<8}{'all':>8}{'effect':>8}{'target':>8}")
    for key, target in (("stage", 0.99), ("layer", 0.90), ("top1", 0.90), ("top3", 0.98)):
        print(f"{key:<8}{tally[key] / n:>8.3f}{seen[key] / m:>8.3f}{target:>8.2f}")
    print(f"false alarms on clean runs: {alarms}/{runs - tally['n']}")
    print(f"first_divergences == localize on {runs - len(mismatches)}/{runs} runs")
    for run_id, view, mine in mismatches:
        print(f"mismatch: {run_id}: first_divergences {view} vs localize {mine}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--examples", nargs="*", default=list(EXAMPLES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=100, help="compare.samples of every run")
    ap.add_argument("--frames", type=int, default=300, help="data.evaluation_samples")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    store = RunStore(Path(tempfile.mkdtemp(prefix="qparity-loc-")))
    mismatches, t0 = [], time.perf_counter()
    pools, alarms = clean_runs(args, store, mismatches)
    tally = dict.fromkeys(("n", "stage", "layer", "top1", "top3"), 0)
    seen = dict(tally)  # observable faults only
    misses = []
    for i in range(args.faults):
        name = args.examples[i % len(args.examples)]
        spec, pool, clean_id = pools[name]
        fault = rng.choice(pool)
        faulted = spec.model_copy(update={"faults": [fault]})
        result = run_chain(faulted, EXAMPLES[name].read_text(), store.root, use_prefect=False)
        s, lay, top1, top = judge(result.analysis, fault)
        obs = observable(store, clean_id, result.run_id, fault.stage)
        for key, ok in (("n", True), ("stage", s), ("layer", lay), ("top1", top1), ("top3", top)):
            tally[key] += ok
            seen[key] += ok and obs
        if not lay:
            misses.append((name, fault, result.analysis.summary().splitlines()[0]))
        print(f"{i + 1:4d} {name:<12} {fault.kind:<16} {fault.layer or '-':<24} "
              f"stage={'ok' if s else 'MISS'} layer={'ok' if lay else 'MISS'} "
              f"top1={'ok' if top1 else 'MISS'} top3={'ok' if top else 'MISS'} "
              f"{sql_check(store, result, mismatches)}{'' if obs else '  (no effect on ' + fault.stage + ')'}",
              flush=True)  # fmt: skip
    report(tally, seen, alarms, len(pools) + tally["n"], mismatches, t0)
    for name, fault, line in misses:
        print(f"miss: {name} {fault.kind} {fault.layer} {fault.amount}: {line}")


if __name__ == "__main__":
    main()
