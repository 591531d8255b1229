"""The vendor's consistency-strategy claims, measured on the bundled examples.

For each example, with and without conv/linear bias, and each level (none, 0, 1, 2) this
runs prepare -> convert and prints, over the evaluation frames:
- identical: share of integer layer outputs (int8/int16) of quantized.onnx equal to
  qat.export's, element by element;
- own_off: share of conv/linear output elements (and of the adds they are fused into)
  that differ when each integer layer is re-run on qat.export's own inputs;
- max_steps: the largest error a conv/linear layer (or the add a conv/linear is fused into)
  adds on its own, in output quantization steps: each integer layer re-run on qat.export's
  inputs (analysis.single_layer), so errors inherited from upstream do not count;
- top-1 of qat (calibrated) and of quantized.

"Without bias" models are the trained ones with every conv/linear bias removed and each
BatchNorm reduced to its scale (folded into the weights, its shift dropped): the numbers
of that variant measure arithmetic agreement, not accuracy.

    python bench/consistency_levels.py [--frames 300]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.single_layer import own_error_steps  # noqa: E402
from pipelines.flow import run_chain  # noqa: E402
from schemas.artifacts import QatExportModel, QuantizedModel  # noqa: E402
from schemas.spec import load_spec, with_overrides  # noqa: E402
from schemas.store import RunStore  # noqa: E402
from stages.capture import capture  # noqa: E402
from stages.context import RunContext  # noqa: E402
from stages.convert.stage import run_integer  # noqa: E402
from stages.pre_export import load_qat_export  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "digits": ROOT / "examples/digits/spec.yaml",
    "transformer": ROOT / "examples/transformer/spec.yaml",
}
NO_BIAS = {
    "digits": "bench.consistency_levels:digits_no_bias",
    "transformer": "bench.consistency_levels:transformer_no_bias",
}
LEVELS = ("none", 0, 1, 2)


def _strip_bias(model: torch.nn.Module) -> torch.nn.Module:
    """Drop conv/linear biases; reduce BatchNorm to its per-channel scale on the conv."""
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        for parent in model.modules():
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.BatchNorm2d):
                    setattr(parent, name, _ScaleOnly(child))
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) and m.bias is not None:
                m.bias = None
    return model


class _ScaleOnly(torch.nn.Module):
    """y = x * gamma / sqrt(var + eps): a BatchNorm without its shift (no bias to fold)."""

    def __init__(self, bn: torch.nn.BatchNorm2d):
        super().__init__()
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        self.register_buffer("scale", scale.detach().reshape(1, -1, 1, 1))

    def forward(self, x):
        return x * self.scale


def digits_no_bias() -> torch.nn.Module:
    from examples.digits.model import build

    return _strip_bias(build())


def transformer_no_bias() -> torch.nn.Module:
    from examples.transformer.model import build

    return _strip_bias(build())


def measure(store: RunStore, run_id: str, spec, frames: int) -> dict:
    """identical share, max steps over conv/linear, top-1 of qat and quantized."""
    run = store.open(run_id)
    ctx = RunContext(spec=spec, run=run, code_version="")
    qexp = load_qat_export(run.load_artifact("pre_export", QatExportModel), ctx)
    quant = run.load_artifact("convert", QuantizedModel)
    x = ctx.evaluation.x[:frames]
    _, ref = capture(qexp, torch.from_numpy(x))
    _, ints = run_integer(run.root, quant, x)
    same = total = 0
    for lid, (q, scale) in ints.items():
        if q.dtype == np.int32 or lid not in ref:
            continue
        s = scale.reshape([-1] + [1] * (q.ndim - 2)) if scale.size > 1 else scale
        ref_q = np.round(ref[lid].numpy() / s)
        same, total = same + int((ref_q == q).sum()), total + q.size
    own = own_error_steps(
        onnx.load(str(run.path(quant.onnx_file))),
        json.loads(run.path(quant.layers_file).read_text()),
        {k: v.numpy() for k, v in ref.items()},
    )
    weighted = [v for k, v in own.items() if k in _weighted_layers(run)]
    worst = max((m for m, _ in weighted), default=0.0)
    off = float(np.mean([share for _, share in weighted])) if weighted else 0.0
    tops = {m["stage"]: m["value"] for m in _metrics(run)}
    return {
        "identical": same / max(total, 1),
        "max_steps": worst,
        "own_off": off,
        "qat": tops.get("calibrate"),
        "quantized": tops.get("convert"),
    }


def _weighted_layers(run) -> set[str]:
    """conv/linear layer ids, plus the add each fused conv/linear feeds."""
    layers = json.loads(run.path("artifacts/prepare/layers.json").read_text())
    by_node = {r["node"]: r for r in layers}
    out = {r["layer_id"] for r in layers if r["op_type"] in ("conv", "linear")}
    for r in layers:
        if r["op_type"] in ("add", "sub") and any(
            by_node.get(i, {}).get("op_type") in ("conv", "linear") for i in r["inputs"]
        ):
            out.add(r["layer_id"])
    return out


def _metrics(run):
    from schemas.tables import read_run_table

    return read_run_table(run, "metrics")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--examples", nargs="*", default=list(EXAMPLES))
    args = ap.parse_args()
    store = RunStore(Path(tempfile.mkdtemp(prefix="qparity-bench-")))
    print(
        f"{'example':<12}{'bias':<6}{'level':<7}{'identical':>10}{'own_off':>9}"
        f"{'max_steps':>10}{'qat top1':>10}{'quant top1':>11}"
    )
    for name in args.examples:
        for bias in (True, False):
            for level in LEVELS:
                row = _one(store, name, bias, level, args.frames)
                print(
                    f"{name:<12}{'yes' if bias else 'no':<6}{level!s:<7}"
                    f"{row['identical']:>10.4f}{row['own_off']:>9.4f}{row['max_steps']:>10.0f}"
                    f"{row['qat']:>10.4f}{row['quantized']:>11.4f}",
                    flush=True,
                )


def _one(store: RunStore, name: str, bias: bool, level, frames: int) -> dict:
    sets = [f"quant.consistency_level={level}", "stages.stop_after=convert"]
    if not bias:
        sets.append(f"model.factory={NO_BIAS[name]}")
    spec = with_overrides(load_spec(EXAMPLES[name]), sets)
    result = run_chain(spec, EXAMPLES[name].read_text(), store.root, use_prefect=False)
    return measure(store, result.run_id, spec, frames)


if __name__ == "__main__":
    main()
