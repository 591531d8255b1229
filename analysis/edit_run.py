"""Run the editor on a run: edit qat.onnx, reconvert, rank the fallbacks (analysis.edit)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from analysis.edit import agreement, parse_numbers, remove_fake_quant
from schemas.artifacts import QatOnnxModel
from schemas.spec import load_spec
from schemas.store import RunStore
from stages.context import RunContext, convert_settings
from stages.convert_graph import Converter
from stages.onnx_runner import OnnxRunner

SAMPLES = 200


@dataclass
class Fallback:
    """One edit: the node numbers made float, pairs removed, agreement and its gain."""

    numbers: str
    removed: int
    l1: float
    cosine: float
    gain: float


def edit_run(store_root: str | Path, run_id: str, numbers_text: str) -> tuple[dict, list[Fallback]]:
    """(unedited agreement, fallbacks best first) for the numbered nodes of a run's qat.onnx."""
    run = RunStore(store_root).open(run_id)
    ctx = RunContext(spec=load_spec(run.path("spec.yaml")), run=run, code_version="")
    art = run.load_artifact("export", QatOnnxModel)
    model = onnx.load(str(run.path(art.onnx_file)))
    numbers = parse_numbers(numbers_text, len(model.graph.node))
    x = ctx.evaluation.x[:SAMPLES]
    base = _agreement(model, ctx, x)
    out = [_fallback(model, [k], str(k), ctx, x, base) for k in numbers]
    out = [f for f in out if f.removed]
    if len(numbers) > 1:
        out.append(_fallback(model, numbers, numbers_text, ctx, x, base))
    return base, sorted(out, key=lambda f: -f.gain)


def _fallback(model, numbers, label, ctx, x, base) -> Fallback:
    edited, removed = remove_fake_quant(model, numbers)
    if not removed:
        return Fallback(label, 0, base["l1"], base["cosine"], 0.0)
    got = _agreement(edited, ctx, x)
    return Fallback(label, removed, got["l1"], got["cosine"], base["l1"] - got["l1"])


def _agreement(qat: onnx.ModelProto, ctx: RunContext, x: np.ndarray) -> dict:
    """Convert ``qat`` as the run's convert did, run both on ``x``, compare outputs."""
    quantized, _ = Converter(qat, convert_settings(ctx.spec)).run()
    qat_out = OnnxRunner(qat).run(x)[0]
    int_out = OnnxRunner(quantized).run(x)[0]
    return agreement(qat_out, int_out)
