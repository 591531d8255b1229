"""Speed of the bit-exact simulator against torch float32 eager and onnxruntime.

For each model (by default torchvision's ResNet-18, ResNet-50 and MobileNetV2 at 224x224x3
from examples/zoo/models.py, seeded, 10 classes, at batch 1 and 8; also examples/digits and
examples/transformer) this runs the chain up to compile in a run store (calibrated on 8
frames), then times, side by side in this one process on the same batch of frames:

- sim:   ``Executor(hbm.load(model.hbm)).run({input: x})``, the bit-exact integer program
         (with the compiled kernels of ``simulator.runtime.native`` when they build here: the
         header line says; ``QPARITY_NATIVE=0`` measures the torch kernels alone); a line
         per model says which kernel each instruction ran on (AMX / VNNI / torch);
- torch: the float model in float32 eager under ``torch.inference_mode()``;
- ORT int8: the float model through onnxruntime's ``quantize_static`` (QOperator,
         per-channel int8, ORT_ENABLE_ALL, 2 threads; :mod:`bench.ort_int8`): the int8
         runtime a user would pick, the anchor of the 1.5x target;
- ORT:   qat.onnx through ``stages.onnx_runner.OnnxRunner`` (onnxruntime, BASIC graph
         optimization, 2 threads: what the chain uses) when the graph has only standard
         ops; with ``qparity`` custom ops (tables, softmax, LayerNorm) onnxruntime cannot
         load it and the number is n/a.

Timing: warm-up rounds of every engine (``sim_probe.WARMUP``: the simulator freezes its plan
and, at batch 8, its split over its first runs), then rounds that run every engine once in turn
(so drift hits all equally), each once this process's threads have gone idle
(``sim_probe.settle``: onnxruntime's and libgomp's pools spin on after a run and would
take a core from the next engine); each engine's time is the median over the rounds
(``time.perf_counter``). torch keeps its default thread count (the machine's cores) and
onnxruntime runs 2 intra-op threads. Each chain runs in a child process with a per-stage
time limit, so a stage that is too slow is reported (name and time) instead of waited for.

    python bench/simulator.py [--models resnet18 resnet50 mobilenet_v2 digits transformer]
                              [--batches 1 8] [--rounds 7] [--stage-timeout 180]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench import ort_int8  # noqa: E402
from bench.sim_probe import (  # noqa: E402
    MIN_TIMED_S,
    WARMUP,
    conv_anatomy,
    kernel_variants,
    measure,
    under_load,
    wait_quiet,
)
from bench.sim_report import print_splits, print_table  # noqa: E402
from schemas.spec import PipelineSpec, load_spec, with_overrides  # noqa: E402


def _zoo(name: str) -> tuple[Path, tuple[int, ...], list[str]]:
    """A torchvision model of the zoo (examples/zoo/models.py: seeded, 10 classes) at 224."""
    return (ROOT / "examples/zoo/spec.yaml", (1, 8),
            [f"name={name.replace('_', '-')}-bench", f"model.factory=examples.zoo.models:{name}",
             f"data.dataset=examples.zoo.data:{name}", "data.calibration_samples=8",
             "data.evaluation_samples=8", "data.batch_size=4", "stages.calibrate.batch_size=4",
             "compare.enabled=false", f"tags={{example: {name}}}"])  # fmt: skip


MODELS = {
    # name: (spec file, batches, overrides that keep the chain fast)
    "digits": (ROOT / "examples/digits/spec.yaml", (256,),
               ["data.evaluation_samples=256"]),
    "transformer": (ROOT / "examples/transformer/spec.yaml", (256,),
                    ["data.evaluation_samples=256"]),
    "resnet18": _zoo("resnet18"),
    "resnet50": _zoo("resnet50"),
    "mobilenet_v2": _zoo("mobilenet_v2"),
}  # fmt: skip
DEFAULT_MODELS = ("resnet18", "resnet50", "mobilenet_v2")
os.environ.setdefault("QPARITY_ZOO_FRAMES", "8")  # the zoo labels only the frames it times
os.environ.setdefault("QPARITY_ZOO_CALIBRATION", "8")  # and calibrates on


def bench_spec(name: str) -> PipelineSpec:
    path, _, sets = MODELS[name]
    return with_overrides(load_spec(path), [*sets, "stages.stop_after=compile"])


# -- the chain, in a child process ------------------------------------------------------------


def _child(name: str, store: str) -> None:
    """Run one model's chain; print one JSON line per event (flushed) for the parent."""
    from pipelines.flow import run_chain
    from stages.registry import plan

    def emit(**kw) -> None:
        print("@@" + json.dumps(kw), flush=True)

    spec = bench_spec(name)
    stages = [s.name for s, _ in plan(spec)]
    emit(event="plan", stages=stages)
    emit(event="start", stage=stages[0])
    t = [time.perf_counter()]

    def on_stage(stage: str, outcome) -> None:
        now = time.perf_counter()
        emit(event="done", stage=stage, seconds=round(now - t[0], 2))
        t[0] = now
        nxt = stages.index(stage) + 1
        if nxt < len(stages):
            emit(event="start", stage=stages[nxt])

    text = MODELS[name][0].read_text()
    result = run_chain(spec, text, Path(store), use_prefect=False, on_stage=on_stage)
    emit(event="finished", run_id=result.run_id, wall_s=round(result.wall_s, 2))


def run_chain_limited(name: str, store: Path, stage_timeout: float) -> dict:
    """The chain in a child process; kill it when one stage runs past ``stage_timeout``.

    Returns ``{"run_id", "stages": {stage: s}}`` or ``{"error", "stage", "seconds", ...}``.
    """
    cmd = [sys.executable, "-u", str(Path(__file__).resolve()), "--_child", name, str(store)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    lines: queue.Queue = queue.Queue()
    err: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)],
                     daemon=True).start()  # fmt: skip
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    out = {"stages": {}}
    current, started = None, time.perf_counter()
    while True:
        left = stage_timeout - (time.perf_counter() - started)
        try:
            line = lines.get(timeout=max(left, 0.01))
        except queue.Empty:
            proc.kill()
            proc.wait()
            return {**out, "error": "timeout", "stage": current,
                    "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
        if line is None:
            break
        if not line.startswith("@@"):
            continue
        ev = json.loads(line[2:])
        if ev["event"] == "start":
            current, started = ev["stage"], time.perf_counter()
        elif ev["event"] == "done":
            out["stages"][ev["stage"]] = ev["seconds"]
        elif ev["event"] == "finished":
            out["run_id"], out["wall_s"] = ev["run_id"], ev["wall_s"]
    proc.wait()
    if proc.returncode != 0 or "run_id" not in out:
        tail = "".join(err)[-1500:]
        return {**out, "error": f"exit {proc.returncode}", "stage": current,
                "seconds": round(time.perf_counter() - started, 1), "stderr": tail}  # fmt: skip
    return out


# -- engines --------------------------------------------------------------------------------


_INT8: dict[str, tuple] = {}
"""Each model's ORT int8 session (dynamic batch), built once for all its batches."""


def sim_engine(name: str, store: Path, run_id: str, batch: int):
    """(x, labels, timed sim executor, its input's name) of one model's compiled run: the
    first ``batch`` evaluation frames and ``Executor(timings=True)`` on its model.hbm."""
    from schemas.artifacts import HbmModel
    from schemas.store import RunStore
    from simulator.program import hbm
    from simulator.runtime.executor import Executor
    from stages.data import load_splits

    d = bench_spec(name).data
    run = RunStore(store).open(run_id)
    ev = load_splits(d.dataset, d.calibration_samples, d.evaluation_samples)["evaluation"]
    x = np.ascontiguousarray(ev.x[:batch])
    if len(x) < batch:
        raise SystemExit(f"{name}: only {len(x)} evaluation frames for batch {batch}")
    program = hbm.load(run.path(run.load_artifact("compile", HbmModel).hbm_file))
    executor = Executor(program, timings=True)  # 1 perf_counter per instruction: negligible
    return x, ev.y[:batch], executor, next(iter(program.inputs))


def engines(name: str, store: Path, run_id: str, batch: int):
    """(x, {engine: fn() -> logits}, timed sim executor, labels, notes) for one model."""
    from schemas.artifacts import QatOnnxModel
    from schemas.store import RunStore
    from stages.data import load_splits
    from stages.modelio import build_float
    from stages.onnx_runner import DOMAIN, OnnxRunner

    spec = bench_spec(name)
    run = RunStore(store).open(run_id)
    d = spec.data
    x, labels, executor, in_name = sim_engine(name, store, run_id, batch)
    model = build_float(spec.model.factory, spec.model.weights, spec.model.kwargs)
    xt = torch.from_numpy(x)

    def torch_fp32():
        with torch.inference_mode():
            return model(xt).numpy()

    fns = {"sim": lambda: next(iter(executor.run({in_name: x})[0].values())),
           "torch": torch_fp32}  # fmt: skip
    notes = []
    calib = load_splits(d.dataset, d.calibration_samples, 1)["calibration"].x
    if name not in _INT8:
        _INT8[name] = ort_int8.session(model, np.ascontiguousarray(calib), store / name)
    int8, ops = _INT8[name]
    fns["ORT int8"] = lambda: int8(x)
    notes.append("ORT int8: the float model through quantize_static (QOperator, u8 activations, per-channel s8 weights, "
                 f"ORT_ENABLE_ALL, 2 threads): {', '.join(f'{k} {v}' for k, v in sorted(ops.items()) if k.startswith('Q'))}")  # noqa: E501  # fmt: skip
    qat = run.load_artifact("export", QatOnnxModel)
    runner = OnnxRunner(run.path(qat.onnx_file))
    if runner.backend == "onnxruntime":
        fns["ORT"] = lambda: runner.run(x)[0]
    else:
        custom = sorted({n.op_type for n in runner.model.graph.node if n.domain == DOMAIN})
        notes.append(f"ORT n/a: qat.onnx holds {DOMAIN}-domain custom ops "
                     f"({', '.join(custom)}) that onnxruntime cannot load; the chain runs it "
                     "with onnx's ReferenceEvaluator instead (not a speed reference)")  # fmt: skip
    return x, fns, (executor, in_name), labels, notes


def time_batch(name: str, batch: int, store: Path, run_id: str, args) -> tuple:
    """One model at one batch: (table row, notes, time split) after a quiet wait."""
    x, fns, sim_exec, labels, extra = engines(name, store, run_id, batch)
    notes = [f"{name}: {n}" for n in extra]
    outs = {k: fn() for k, fn in fns.items()}
    agree = {k: float((np.asarray(v).reshape(len(x), -1).argmax(1) == labels).mean())
             for k, v in outs.items()}  # fmt: skip
    print(f"# {name} batch {batch}: kernels that ran: {kernel_variants(sim_exec, x)}", flush=True)
    before = wait_quiet(args.quiet_wait)
    secs, split, load = measure(fns, max(args.rounds, 5), sim_exec[0])
    split["path"] = sim_exec[0].last_path
    fps = {k: batch / s for k, s in secs.items()}
    print(f"# {name} batch {batch}: median per batch over {split['rounds']} rounds " + ", ".join(
          f"{k} {s * 1e3:.1f} ms" for k, s in secs.items()) + "; top-1 vs labels on the "
          "batch " + ", ".join(f"{k} {a:.3f}" for k, a in agree.items()) + "; other processes "
          f"used {before:.2f} cores before, {load:.2f} during timing; sim ran its "
          f"{sim_exec[0].last_path}", flush=True)  # fmt: skip
    row = (name, batch, fps["sim"], fps["torch"], fps.get("ORT"), load, fps.get("ORT int8"))
    if args.load:
        loaded, busy = under_load(fns, fns["sim"], max(args.rounds, 5))
        int8 = loaded.get("ORT int8")
        print(f"# {name} batch {batch}: with a busy loop on core 1 (others used {busy:.2f} "
              "cores), median per batch: " + ", ".join(
              f"{k} {s * 1e3:.1f} ms" + (f" ({int8 / s:.2f}x ORT int8)" if int8 and
              k.startswith("sim") else "") for k, s in loaded.items()), flush=True)  # fmt: skip
    anatomy = conv_anatomy(sim_exec, x) if name == "resnet18" and batch > 1 else None
    return row, notes, (split, sim_exec[0].program, secs["sim"], anatomy)


def bench_model(name: str, store: Path, args) -> tuple[list, list, dict]:
    """The chain of one model, then each of its batches timed: (rows, notes, splits)."""
    batches = args.batches or MODELS[name][1]
    t0 = time.perf_counter()
    chain = run_chain_limited(name, store, args.stage_timeout)
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in chain["stages"].items())
    print(f"# {name}: chain {time.perf_counter() - t0:.1f}s ({stages})", flush=True)
    if "error" in chain:
        msg = (f"{name}: chain stopped in stage {chain['stage']} after "
               f"{chain['seconds']}s ({chain['error']})")  # fmt: skip
        print("# " + msg + ("\n" + chain["stderr"] if chain.get("stderr") else ""), flush=True)
        return [(name, b, None, None, None, float("nan"), None) for b in batches], [msg], {}
    rows, notes, splits = [], [], {}
    for batch in batches:
        row, extra, split = time_batch(name, batch, store, chain["run_id"], args)
        rows.append(row)
        notes += [n for n in extra if n not in notes]
        splits[(name, batch)] = split
    return rows, notes, splits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS), choices=list(MODELS))
    ap.add_argument("--batches", nargs="*", type=int, default=None,
                    help="batch sizes (default: each model's own, 1 and 8 for the CNNs)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (>= 5)")
    ap.add_argument("--stage-timeout", type=float, default=180.0,
                    help="seconds one chain stage may take before it is reported and skipped")  # fmt: skip
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="seconds to wait for other processes to go idle before timing")  # fmt: skip
    ap.add_argument("--load", action="store_true",
                    help="also time each batch while a busy loop holds one core: the simulator "
                    "on 2 threads, 1 thread and auto (QPARITY_THREADS unset), side by side")  # fmt: skip
    ap.add_argument("--store", default=None, help="run store (default: a temporary folder)")
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        _child(*args._child)
        return
    store = Path(args.store or tempfile.mkdtemp(prefix="qparity-bench-sim-"))
    from simulator.runtime import native

    print(f"# run store {store}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} cores; load average {Path('/proc/loadavg').read_text().strip()}; "
          f"at least {max(args.rounds, 5)} timed rounds after {WARMUP} warm-up rounds (fast "
          "models up to "
          f"{MIN_TIMED_S:.0f} s of rounds); compiled kernels {native.status()}; LINEAR on "
          f"{native.linear_kernel()}", flush=True)  # fmt: skip
    rows, notes, splits, t_start = [], [], {}, time.perf_counter()
    for name in args.models:
        r, n, s = bench_model(name, store, args)
        rows, notes, splits = rows + r, notes + n, {**splits, **s}
    print()
    print_table(rows)
    for n in notes:
        print(f"note: {n}")
    busy = [r[5] for r in rows if r[5] == r[5] and r[5] > 0.25]
    if busy:
        print(f"note: other processes used up to {max(busy):.2f} of {os.cpu_count()} cores "
              "while timing: absolute numbers are pessimistic and noisy (torch's threads wait "
              "on each other), rerun on a quiet machine")  # fmt: skip
    print_splits(splits)
    print(f"\n# total {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()
