"""Run the editor on a run: edit qat.onnx, reconvert, rank the fallbacks (analysis.edit).

Every model compared is the run's model as the run computed it: qat.onnx already holds
pre_export's faults (its tables), and each reconverted integer graph is converted as the
convert stage does (constant-only nodes folded first) and gets the run's convert faults
again (stages.faults.reapply_convert), so an edit's gain is measured against the faulty
model the run localized, not a clean one. Every input of the model is fed, and a model
with several outputs is compared on its judged one (``compare.output``; stages/outputs.py). The edit of all the numbers together is
written to ``artifacts/edit/<name>/qat_modified.onnx`` (the vendor's qat_modified.bc).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from analysis.edit import agreement, edit_name, parse_numbers, remove_fake_quant, why_kept
from analysis.ptq_analysis import is_ptq_run
from schemas.artifacts import QatOnnxModel
from schemas.errors import SpecError, StageError
from schemas.spec import load_spec
from schemas.store import RunStore
from stages.context import RunContext, convert_settings
from stages.convert.graph import Converter
from stages.faults import faults_of, reapply_convert
from stages.onnx_fold import fold_constant_nodes
from stages.onnx_runner import OnnxRunner
from stages.stage_runners import judged_index

SAMPLES = 200


@dataclass(frozen=True)
class Samples:
    """What every model is compared on: the first evaluation samples of each input, and
    the position of the judged output among the graph's outputs."""

    x: tuple[np.ndarray, ...]
    at: int


@dataclass
class Fallback:
    """One edit: the node numbers made float, pairs removed, agreement and its gain."""

    numbers: str
    removed: int
    l1: float
    cosine: float
    gain: float
    faults_skipped: list[str] = field(default_factory=list)
    """The run's convert faults this edit left nothing to hit (their layer is now float)."""


@dataclass
class EditResult:
    """The unedited agreement, the fallbacks best first, what was written and kept."""

    base: dict
    fallbacks: list[Fallback]
    written: str
    """Run-relative path of the edited qat.onnx (all the numbers together)."""
    kept: list[str]
    """Why each number with no fake quant to remove was left as it is."""
    faults: int
    """How many of the run's convert faults every reconverted graph gets again."""


def edit_run(store_root: str | Path, run_id: str, numbers_text: str) -> EditResult:
    """Edit the numbered nodes of a run's qat.onnx, write the edit, rank the fallbacks."""
    run = RunStore(store_root).open(run_id)
    if is_ptq_run(run):
        raise SpecError(
            f"run {run_id} is a PTQ chain run: it has no qat.onnx to edit",
            where="qparity edit",
            hint="edit a QAT chain run (qparity run SPEC), whose export stage writes qat.onnx",
        )
    ctx = RunContext(spec=load_spec(run.path("spec.yaml")), run=run, code_version="")
    model = onnx.load(str(run.path(run.load_artifact("export", QatOnnxModel).onnx_file)))
    numbers = parse_numbers(numbers_text, len(model.graph.node))
    x = _samples(ctx, model)
    base = _agreement(model, ctx, x)
    singles = [_fallback(model, [k], str(k), ctx, x, base) for k in numbers]
    out = [f for f in singles if f.removed]
    kept = [why_kept(model, k) for k, f in zip(numbers, singles, strict=True) if not f.removed]
    if not out:
        more = f"; and {len(kept) - 3} more" if len(kept) > 3 else ""
        raise SpecError(
            "nothing to remove: " + "; ".join(kept[:3]) + more, where="--remove-fake-quant",
            hint="number a quantizer or a compute node (Conv, Gemm, Add, Mul...) of "
            "debug/qat_onnx.txt",
        )  # fmt: skip
    if len(out) > 1:
        out.append(_fallback(model, numbers, numbers_text, ctx, x, base))
    written = _write(ctx, remove_fake_quant(model, numbers)[0], edit_name(numbers))
    faults = len(faults_of(ctx, "convert"))
    return EditResult(base, sorted(out, key=lambda f: -f.gain), written, kept, faults)


def _fallback(model, numbers, label, ctx, x, base) -> Fallback:
    edited, removed = remove_fake_quant(model, numbers)
    if not removed:
        return Fallback(label, 0, base["l1"], base["cosine"], 0.0)
    try:
        got = _agreement(edited, ctx, x)
    except StageError as e:
        raise StageError(
            f"with the fake quant of node(s) {label} of qat.onnx removed, the graph no longer "
            f"converts or runs ({e.what})",
            where=f"qparity edit {ctx.run.run_id}",
            hint=f"leave node(s) {label} quantized: drop them from --remove-fake-quant",
        ) from e
    gain = base["l1"] - got["l1"]
    return Fallback(label, removed, got["l1"], got["cosine"], gain, got["faults_skipped"])


def _samples(ctx: RunContext, model: onnx.ModelProto) -> Samples:
    """Every input's first SAMPLES evaluation samples; the judged output's position (the
    float model runs only to tell several outputs apart)."""
    at = judged_index(ctx) if len(model.graph.output) > 1 else 0
    return Samples(ctx.evaluation.arrays(0, SAMPLES), at)


def _agreement(qat: onnx.ModelProto, ctx: RunContext, x: Samples) -> dict:
    """Convert ``qat`` as the run's convert did (constant-only nodes folded first), its
    faults too; run both on ``x``; compare the judged outputs (and name the faults left
    nothing to hit)."""
    quantized, layers = Converter(fold_constant_nodes(qat)[0], convert_settings(ctx.spec)).run()
    skipped = reapply_convert(ctx, quantized, layers)
    qat_out = OnnxRunner(qat).run(x.x)[x.at]
    int_out = OnnxRunner(quantized).run(x.x)[x.at]
    return {**agreement(qat_out, int_out), "faults_skipped": skipped}


def _write(ctx: RunContext, edited: onnx.ModelProto, name: str) -> str:
    """Save the edited qat.onnx into the run (atomically) and return its relative path."""
    rel = f"artifacts/edit/{name}/qat_modified.onnx"
    ctx.run.write_file(rel, edited.SerializeToString())
    ctx.run.publish()
    return rel
