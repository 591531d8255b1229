"""Per-layer float-vs-QDQ comparison: ours against onnxruntime's quantization debugger.

Shared setup (not timed), in a temporary folder, nothing downloaded: the digits CNN
(``examples.digits.model.build``) exported to ONNX with a dynamic batch, quantized by
``onnxruntime.quantization.quantize_static`` (QDQ, per channel, int8 activations and
weights, MinMax over the first 256 training frames), and the 1000 digits evaluation frames.

Each tool then compares the same two files on the first N frames, in a fresh process:

- ours: :func:`analysis.onnx_pair.compare_onnx_pair`, both models run batch by batch
  (``--batch``) through ``OnnxRunner`` with the matched tensors as extra outputs, every
  pair folded into running sums (``analysis.metrics``): one batch in memory;
- ORT: the recipe of onnxruntime's ``qdq_loss_debug`` (its run_qdq_debug.py example):
  ``modify_model_output_intermediate_tensors`` on both models, ``collect_activations`` of
  both through a ``CalibrationDataReader`` giving one frame per call as its example does,
  ``create_activation_matching`` and ``compute_activation_error`` (xmodel_err, qdq_err);
- ORT batched: the same recipe with the reader giving ``--batch`` frames per call.

Per run: wall time (``time.perf_counter`` around the whole comparison, model loading and
augmentation included) and peak RSS growth (peak resident set, VmHWM, minus the resident set
before, with the imports and frames already loaded and the peak mark reset through
``/proc/self/clear_refs``: Linux only); one extra run per tool under ``tracemalloc`` gives the traced
Python/numpy peak (onnxruntime's own C++ allocations are not traced). Timed runs repeat
``--repeats`` times interleaved; the table shows medians. Correctness: per tensor, our SQNR
(with ORT's eps floor, :meth:`TensorAgreement.sqnr_clamped`) against ORT's xmodel_err and
qdq_err; the maximum difference is printed.

Everything runs twice (``--threads``): onnxruntime's intra-op threads spinning while idle
(its default, what ``OnnxRunner`` and ``collect_activations`` get) and parked, for both
tools alike: spinning threads take the cores from our numpy work between runs.

    python bench/capture.py [--frames 100 1000] [--batch 100] [--repeats 3]
                            [--threads spinning parked]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

TOOLS = ("ours", "ORT", "ORT batched")
SPIN = {"spinning": True, "parked": False}
"""onnxruntime's idle intra-op threads: spinning (its default, what stages.onnx_runner and
collect_activations get) or parked (``session.intra_op.allow_spinning=0``, both tools)."""
CALIBRATION_FRAMES = 256
TARGETS = (("speed", 2.0), ("memory", 0.5))
"""At the largest frame count: ours >= 2x faster, and <= half the memory (RSS growth)."""


def _reader(input_name: str, frames: np.ndarray, per_call: int):
    """A ``CalibrationDataReader`` giving ``per_call`` frames per ``get_next``."""
    from onnxruntime.quantization import CalibrationDataReader

    class FrameReader(CalibrationDataReader):
        def __init__(self) -> None:
            self.start = 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.start >= len(frames):
                return None
            batch = frames[self.start : self.start + per_call]
            self.start += per_call
            return {input_name: batch}

        def rewind(self) -> None:
            self.start = 0

    return FrameReader()


def setup(folder: Path) -> dict[str, float]:
    """float.onnx, qdq.onnx and frames.npy in ``folder``; seconds per step."""
    import torch
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from examples.digits import data, model

    t0 = time.perf_counter()
    net, splits = model.build(), data.load()
    x = torch.from_numpy(splits["evaluation"][0][:2])
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(folder / "float.onnx"), dynamo=False,
                          input_names=["x"], output_names=["logits"], opset_version=17,
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})  # fmt: skip
    t1 = time.perf_counter()
    cal = splits["train"][0][:CALIBRATION_FRAMES]
    quantize_static(str(folder / "float.onnx"), str(folder / "qdq.onnx"),
                    _reader("x", cal, 64), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)  # fmt: skip
    np.save(folder / "frames.npy", splits["evaluation"][0])
    return {"export": t1 - t0, "quantize": time.perf_counter() - t1}


# -- the two tools (each called in its own child process) -----------------------------------


def run_ours(folder: Path, frames: np.ndarray, batch: int) -> dict[str, dict[str, float]]:
    """Our streamed comparison; per tensor the SQNRs with ORT's eps floor."""
    import onnx

    from analysis.onnx_pair import compare_onnx_pair, match_pairs

    f_path, q_path = folder / "float.onnx", folder / "qdq.onnx"
    pairs = match_pairs(onnx.load(str(f_path)), onnx.load(str(q_path)))
    batches = (frames[i : i + batch] for i in range(0, len(frames), batch))
    res = compare_onnx_pair(f_path, q_path, pairs, batches)
    return {
        k: {"xmodel": r.sqnr_clamped("xmodel") if r.xmodel else None,
            "qdq": r.sqnr_clamped("qdq"), "cosine": r.xmodel.get("cosine")}
        for k, r in res.items()
    }  # fmt: skip


def run_ort(folder: Path, frames: np.ndarray, per_call: int) -> dict[str, dict[str, float]]:
    """onnxruntime's qdq_loss_debug recipe, augmented models written to a fresh folder."""
    from onnxruntime.quantization import qdq_loss_debug as dbg

    work = Path(tempfile.mkdtemp(dir=folder))
    acts = {}
    for name in ("float", "qdq"):
        aug = str(work / f"{name}.save_tensors.onnx")
        dbg.modify_model_output_intermediate_tensors(str(folder / f"{name}.onnx"), aug)
        acts[name] = dbg.collect_activations(aug, _reader("x", frames, per_call))
    matching = dbg.create_activation_matching(acts["qdq"], acts["float"])
    err = dbg.compute_activation_error(matching)
    return {k: {"xmodel": v.get("xmodel_err"), "qdq": v["qdq_err"]} for k, v in err.items()}


def _status_mb(key: str) -> float:
    """A ``/proc/self/status`` figure (VmRSS: resident now, VmHWM: peak resident) in MB."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key + ":")) / 1024


def _reset_peak() -> None:
    """Set the peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _park_threads() -> None:
    """Every onnxruntime session made from now on parks idle intra-op threads instead of
    spinning: ``SessionOptions`` gains ``session.intra_op.allow_spinning=0`` (both
    stages.onnx_runner and collect_activations build theirs through it)."""
    import onnxruntime as ort

    class Parked(ort.SessionOptions):
        def __init__(self) -> None:
            super().__init__()
            self.add_session_config_entry("session.intra_op.allow_spinning", "0")

    ort.SessionOptions = Parked


def measure(tool: str, folder: Path, n: int, batch: int, traced: bool, spin: bool) -> dict:
    """(in a fresh child) one tool on ``n`` frames: wall time, peak RSS growth over the
    RSS before (imports and frames already loaded; peak mark reset), traced peak."""
    import tracemalloc

    import onnx  # noqa: F401  (imports done before the baseline, for both tools)
    import onnxruntime.quantization.qdq_loss_debug  # noqa: F401

    import analysis.onnx_pair  # noqa: F401

    if not spin:
        _park_threads()
    frames = np.ascontiguousarray(np.load(folder / "frames.npy")[:n])
    _reset_peak()
    before = _status_mb("VmRSS")
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    if tool == "ours":
        sqnr = run_ours(folder, frames, batch)
    else:
        sqnr = run_ort(folder, frames, 1 if tool == "ORT" else batch)
    wall = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20 if traced else None
    return {"wall_s": wall, "rss_mb": _status_mb("VmHWM") - before, "rss_before_mb": before,
            "traced_mb": peak, "sqnr": sqnr}  # fmt: skip


def spawn(tool: str, folder: Path, n: int, batch: int, spin: bool, traced: bool = False) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", tool, str(folder),
           str(n), str(batch), str(int(traced)), str(int(spin))]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{tool} on {n} frames failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the parent: runs, table, agreement -------------------------------------------------------


def collect(folder: Path, frames: list[int], batch: int, repeats: int, spin: bool) -> dict:
    """{(tool, n): {"runs": [...], "traced": {...}}}: ``repeats`` interleaved timed runs
    per tool and frame count, then one traced run each."""
    res = {(t, n): {"runs": []} for n in frames for t in TOOLS}
    for n in frames:
        for r in range(repeats):
            for tool in TOOLS:
                run = spawn(tool, folder, n, batch, spin)
                run["load"] = os.getloadavg()[0]
                res[tool, n]["runs"].append(run)
                print(f"# {n} frames, round {r + 1}: {tool:<12} {run['wall_s']:6.2f} s "
                      f"{run['rss_mb']:7.1f} MB (load {run['load']:.1f})", flush=True)  # fmt: skip
        for tool in TOOLS:
            res[tool, n]["traced"] = spawn(tool, folder, n, batch, spin, traced=True)
    return res


def summary(res: dict, tool: str, n: int) -> dict[str, float]:
    runs = res[tool, n]["runs"]
    return {
        "s": float(np.median([r["wall_s"] for r in runs])),
        "mb": float(np.median([r["rss_mb"] for r in runs])),
        "traced": res[tool, n]["traced"]["traced_mb"],
    }


def agreement(ours: dict, ref: dict) -> tuple[set[str], float, float]:
    """(tensors only one side reports, max |dSQNR| cross-model, max |dSQNR| qdq) in dB."""
    only = set(ours) ^ set(ref)
    common = sorted(set(ours) & set(ref))
    dx = [abs(ours[k]["xmodel"] - ref[k]["xmodel"]) for k in common if ref[k]["xmodel"]]
    dq = [abs(ours[k]["qdq"] - ref[k]["qdq"]) for k in common]
    return only, max(dx, default=float("nan")), max(dq, default=float("nan"))


def report(res: dict, frames: list[int], setting: str) -> None:
    """Per reference tool: the table, the targets at the largest count, SQNR agreement."""
    n_max = max(frames)
    for ref in TOOLS[1:]:
        print(
            f"\nours vs {ref}, ORT threads {setting} (medians; MB = peak RSS growth; "
            "traced = tracemalloc peak)\n\n| frames | ours s | ORT s | speed ratio | ours MB "
            "| ORT MB | memory ratio | ours traced MB | ORT traced MB |\n" + "|---" * 9 + "|"
        )
        for n in frames:
            a, b = summary(res, "ours", n), summary(res, ref, n)
            print(f"| {n} | {a['s']:.2f} | {b['s']:.2f} | {b['s'] / a['s']:.2f}x | "
                  f"{a['mb']:.1f} | {b['mb']:.1f} | {a['mb'] / max(b['mb'], 1e-9):.2f} | "
                  f"{a['traced']:.1f} | {b['traced']:.1f} |")  # fmt: skip
        a, b = summary(res, "ours", n_max), summary(res, ref, n_max)
        speed, mem = b["s"] / a["s"], a["mb"] / max(b["mb"], 1e-9)
        print(f"\ntargets at {n_max} frames: speed {speed:.2f}x (>= {TARGETS[0][1]}x) "
              f"{'PASS' if speed >= TARGETS[0][1] else 'MISS'}; memory {mem:.2f} "
              f"(<= {TARGETS[1][1]}) {'PASS' if mem <= TARGETS[1][1] else 'MISS'}")  # fmt: skip
    print("\nSQNR agreement (ours with ORT's eps floor minus ORT's, max |diff| over tensors):")
    for n in frames:
        ours = res["ours", n]["runs"][0]["sqnr"]
        for ref in TOOLS[1:]:
            only, dx, dq = agreement(ours, res[ref, n]["runs"][0]["sqnr"])
            print(f"  {n} frames vs {ref:<12} {len(ours)} tensors; xmodel_err {dx:.2e} dB, "
                  f"qdq_err {dq:.2e} dB; unmatched {sorted(only) or 'none'}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, nargs="*", default=[100, 1000])
    ap.add_argument("--batch", type=int, default=100, help="our batch; ORT batched per call")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per tool and count")
    ap.add_argument("--threads", nargs="*", default=list(SPIN), choices=list(SPIN))
    ap.add_argument("--_child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        tool, folder, n, batch, traced, spin = args._child
        got = measure(tool, Path(folder), int(n), int(batch), traced == "1", spin == "1")
        print(json.dumps(got))
        return
    with tempfile.TemporaryDirectory(prefix="qparity-bench-capture-") as tmp:
        folder = Path(tmp)
        steps = setup(folder)
        print(f"# setup (shared, not timed): export {steps['export']:.1f} s, quantize_static "
              f"{steps['quantize']:.1f} s; {os.cpu_count()} cores; ours batch {args.batch}",
              flush=True)  # fmt: skip
        for setting in args.threads:
            print(f"# ORT intra-op threads {setting}", flush=True)
            res = collect(folder, args.frames, args.batch, max(args.repeats, 1), SPIN[setting])
            report(res, args.frames, setting)


if __name__ == "__main__":
    main()
