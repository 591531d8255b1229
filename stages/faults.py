"""Inject the spec's faults (schemas.spec_faults) into a stage's artifact, and record them.

Each function takes what its stage is about to save and returns it corrupted as the fault
says; every fault applied is a row of ``tables/faults``, with whether it changed anything
and why (stages.fault_effects: a fault can apply and change nothing). A fault naming a
layer or op type the stage does not have is a SpecError: a fault that silently hits
nothing would make the localization benchmark lie.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from schemas.errors import SpecError
from schemas.spec_faults import FaultSpec
from schemas.tables import write_rows
from stages.context import RunContext
from stages.fake_quant import quantizers
from stages.fault_effects import (
    Effect,
    board_effect,
    copy_model,
    integer_effect,
    scale_effect,
    table_effect,
)
from stages.modelio import name_quantizers

MULT_TAGS = ("/req_mult#", "/mult#", "/ma#", "/mb#")
SHIFT_TAGS = ("/req_shift#", "/shift#")


def faults_of(ctx: RunContext, stage: str) -> list[FaultSpec]:
    """The spec's faults injected at ``stage``."""
    return [f for f in ctx.spec.faults if f.stage == stage]


def hits(fault: FaultSpec, op_types: dict[str, str]) -> list[str]:
    """The layer ids of ``op_types`` (layer id -> op type) a fault names (maybe none)."""
    return [lid for lid, op in op_types.items() if lid == fault.layer or op == fault.op_type]


def targets(fault: FaultSpec, op_types: dict[str, str]) -> list[str]:
    """The layer ids a fault hits, from ``op_types`` (layer id -> op type) of the stage."""
    hit = hits(fault, op_types)
    if not hit:
        raise SpecError(
            f"fault {fault.kind} names {fault.layer or fault.op_type!r}, which stage "
            f"{fault.stage} does not have",
            where="faults",
            hint=f"use one of: {', '.join(sorted(op_types))[:300]}",
        )
    return hit


def record(ctx: RunContext, stage: str, applied: list[tuple[FaultSpec, str, str, Effect]]) -> None:
    """Write the applied faults (fault, layer id, op type, effect) to tables/faults."""
    rows = [
        {
            "run_id": ctx.run.run_id, "stage": stage, "layer_id": lid, "op_type": op,
            "kind": f.kind, "amount": float(f.amount), "detail": f.model_dump_json(),
            "changed": e.changed, "reason": e.reason,
        }
        for f, lid, op, e in applied
    ]  # fmt: skip
    write_rows(ctx.run, "faults", rows, stage)


def coarsen_tables(initializers: dict[str, np.ndarray], amount: float) -> dict[str, np.ndarray]:
    """Keep every ``2**amount``-th entry of each table (entries in between repeat it)."""
    k = 2 ** int(amount)
    out = {}
    for name, arr in initializers.items():
        if arr.ndim >= 1 and arr.shape[-1] >= 16:
            keep = (np.arange(arr.shape[-1]) // k) * k
            arr = np.ascontiguousarray(arr[..., keep])
        out[name] = arr
    return out


def corrupt_integer_graph(model: onnx.ModelProto, lid: str, fault: FaultSpec) -> onnx.ModelProto:
    """Apply a convert fault to the integer ops of layer ``lid`` in quantized.onnx."""
    hit = False
    for init in model.graph.initializer:
        if not init.name.startswith(f"{lid}/"):
            continue
        arr = numpy_helper.to_array(init)
        new = _corrupt_array(init.name, arr, fault)
        if new is not None:
            init.CopyFrom(numpy_helper.from_array(new.astype(arr.dtype), init.name))
            hit = True
    if fault.kind == "rounding_flip":
        hit = _flip_rounding(model, lid) or hit
    if not hit:
        raise SpecError(
            f"fault {fault.kind} finds nothing to change in layer {lid}",
            where="faults",
            hint="pick a conv, linear, add or requantized layer of quantized.onnx",
        )
    return model


def _corrupt_array(name: str, arr: np.ndarray, fault: FaultSpec) -> np.ndarray | None:
    if fault.kind == "bias_drop" and "/bias#" in name:
        return np.zeros_like(arr)
    if fault.kind == "shift_off" and any(t in name for t in SHIFT_TAGS):
        return arr + int(fault.amount)
    if fault.kind == "scale_steps" and any(t in name for t in MULT_TAGS):
        info = np.iinfo(arr.dtype)
        scaled = np.round(arr.astype(np.float64) * 2 ** (fault.amount / 4))
        return np.clip(scaled, info.min, info.max)
    return None


def _flip_rounding(model: onnx.ModelProto, lid: str) -> bool:
    flipped = False
    for node in model.graph.node:
        if not any(i.startswith(f"{lid}/") for i in node.input):
            continue
        for a in node.attribute:
            if a.name == "rounding":
                a.s = b"bpu_round" if a.s == b"half_even" else b"half_even"
                flipped = True
    return flipped


def op_types(ctx: RunContext, ids) -> dict[str, str]:
    """Layer id -> op type (prepare's layer table) for the ids a stage holds."""
    import json

    records = json.loads(ctx.run.path("artifacts/prepare/layers.json").read_text())
    ops = {r["layer_id"]: r["op_type"] for r in records if not r["merged_into"]}
    return {lid: ops.get(lid, "unknown") for lid in ids}


def _inject(ctx: RunContext, stage: str, ids, apply) -> None:
    """Apply each of ``stage``'s faults to the layers it hits (``apply(fault, layer id)
    -> Effect``) and record them."""
    faults = faults_of(ctx, stage)
    if not faults:
        return
    types, applied = op_types(ctx, ids), []
    for fault in faults:
        for lid in targets(fault, types):
            applied.append((fault, lid, types[lid], apply(fault, lid)))
    record(ctx, stage, applied)


def inject_convert(ctx: RunContext, model: onnx.ModelProto, layer_ids) -> onnx.ModelProto:
    """convert's faults, applied (in place) to quantized.onnx before it is saved; each
    one's effect judged on a calibration batch."""
    x = ctx.calibration.x[: ctx.spec.stages.calibrate.batch_size]

    def apply(fault, lid):
        before = copy_model(model)
        corrupt_integer_graph(model, lid, fault)
        return integer_effect(before, model, lid, x)

    _inject(ctx, "convert", layer_ids, apply)
    return model


def reapply_convert(ctx: RunContext, model: onnx.ModelProto, layer_ids) -> list[str]:
    """convert's faults, applied (in place) to a re-converted graph as the run applied them
    (``qparity edit``), not recorded again. A layer an edit left in float has no integers
    to corrupt: its fault is skipped, and named in the result (``"bias_drop on conv"``)."""
    types, skipped = op_types(ctx, layer_ids), []
    for fault in faults_of(ctx, "convert"):
        hit = hits(fault, types)
        skipped += [] if hit else [f"{fault.kind} on {fault.layer or fault.op_type}"]
        for lid in hit:
            try:
                corrupt_integer_graph(model, lid, fault)
            except SpecError:  # the layer's integer op is gone: nothing left to hit
                skipped.append(f"{fault.kind} on {lid}")
    return skipped


def inject_calibrate(ctx: RunContext, gm) -> None:
    """calibrate's faults: each named layer's output scale (frozen) x ``2**(amount/4)``."""
    roles = name_quantizers(gm)
    outputs = {roles[n][0]: fq for n, fq in quantizers(gm) if roles.get(n, ("", ""))[1] == "output"}

    def rescale(fault, lid):
        before = outputs[lid].scale.detach().cpu().numpy().copy()
        outputs[lid].scale.mul_(2 ** (fault.amount / 4))
        return scale_effect(before, outputs[lid].scale.detach().cpu().numpy())

    _inject(ctx, "calibrate", outputs, rescale)


def inject_pre_export(ctx: RunContext, ops: dict) -> dict:
    """pre_export's faults: coarsen the tables of the fixed-point ops they name."""

    def coarsen(fault, lid):
        before = ops[lid].initializers
        ops[lid].initializers = coarsen_tables(before, fault.amount)
        return table_effect(before, ops[lid].initializers)

    _inject(ctx, "pre_export", ops, coarsen)
    return ops


def record_board(ctx: RunContext) -> None:
    """board_sim's faults in tables/faults (once per stage run; they hit the input)."""
    faults = faults_of(ctx, "board_sim")
    camera = ctx.splits["camera"].x if "camera" in ctx.splits else None
    cfg = ctx.spec.stages.board_sim
    if faults:
        record(ctx, "board_sim", [(f, "input", "input", board_effect(f, cfg, camera))
                                  for f in faults])  # fmt: skip


def inject_board(ctx: RunContext, frames: np.ndarray, color: str) -> tuple[np.ndarray, str]:
    """board_sim's faults: the camera delivers BGR for RGB, or the other BT.601 range."""
    for fault in faults_of(ctx, "board_sim"):
        if fault.amount == 0:
            frames = np.ascontiguousarray(frames[..., ::-1])
        else:
            color = {"bt601_full": "bt601_video", "bt601_video": "bt601_full"}.get(color, color)
    return frames, color
