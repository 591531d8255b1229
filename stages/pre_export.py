"""pre_export: the QAT model whose table ops are fixed point (the vendor's qat.export.pt).

Every table op (sigmoid, exp, gelu..., softmax, layer_norm) inside the spec's subtree is
replaced by its fixed-point form (stages.table_ops); the tables are part of the artifact
(``tables.json`` + ``tables.safetensors``, digest-checked) and are the ones export writes
into qat.onnx. The QAT state itself is unchanged. debug/lut_tables.txt lists each table
with its size and its max error against the float function over its input range.
"""

from __future__ import annotations

import json

import numpy as np
import safetensors.numpy

from schemas.artifacts import QatExportModel, QatModelArtifact
from schemas.errors import ArtifactError
from schemas.fileio import atomic_save
from simulator.arith.lut import LutTable, max_error
from stages.context import RunContext
from stages.evaluate import stage_metrics
from stages.faults import inject_pre_export
from stages.fixed_ops import FixedPointOp
from stages.modelio import load_qat, save_state
from stages.registry_types import StageCall
from stages.table_ops import TableSettings, build_op, find_candidates, rewrite, torch_fn

REFERENCE_FNS = {
    "exp": np.exp,
    "reciprocal": lambda x: 1.0 / x,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sqrt": np.sqrt,
}


def pre_export(upstream: QatModelArtifact, ctx: RunContext, call: StageCall) -> QatExportModel:
    """Make every table op of the QAT model fixed point; evaluate the result."""
    cfg = ctx.spec.stages.pre_export
    gm = load_qat(upstream, ctx)
    out = ctx.artifact_dir("pre_export")
    save_state(gm, out / "qat.safetensors")
    candidates, skipped = find_candidates(gm, list(cfg.subtree))
    settings = TableSettings(cfg.segments, cfg.entries, cfg.dividing)
    built = {c.layer_id: build_op(gm, c, settings) for c in candidates}
    inject_pre_export(ctx, {lid: op for lid, (op, _) in built.items()})
    ctx.write_debug("lut_tables.txt", render_tables(candidates, built, skipped))
    save_tables(ctx, {lid: op for lid, (op, _) in built.items()})
    rewrite(gm, {lid: op for lid, (op, _) in built.items()})
    metrics = stage_metrics(ctx, "pre_export", gm)
    files = [
        f"artifacts/pre_export/{f}"
        for f in ("qat.safetensors", "tables.json", "tables.safetensors")
    ]
    return call.make(
        QatExportModel,
        ctx.run,
        files=files,
        factory=upstream.factory,
        example_shape=upstream.example_shape,
        settings=upstream.settings,
        quant_state="validation",
        state_file=files[0],
        tables_file=files[1],
        fixed_point=sorted(built),
        float_ops=skipped,
        metrics=metrics,
    )


def save_tables(ctx: RunContext, ops: dict[str, FixedPointOp]) -> None:
    """tables.json (ops, attributes, scales) + tables.safetensors (the table arrays)."""
    meta, arrays = [], {}
    for lid, op in sorted(ops.items()):
        meta.append(
            {
                "layer_id": lid,
                "onnx_op": op.onnx_op,
                "attrs": op.attrs,
                "in_scale": op.in_scale,
                "in_dtype": op.in_dtype,
                "out_scale": op.out_scale,
                "out_dtype": op.out_dtype,
                "initializers": list(op.initializers),
            }
        )
        arrays.update({f"{lid}/{k}": np.ascontiguousarray(v) for k, v in op.initializers.items()})
    ctx.run.write_text("artifacts/pre_export/tables.json", json.dumps(meta, indent=1))
    path = ctx.run.path("artifacts/pre_export/tables.safetensors")
    atomic_save(path, lambda tmp: safetensors.numpy.save_file(arrays, tmp))


def load_tables(ctx: RunContext, art: QatExportModel) -> dict[str, FixedPointOp]:
    """The fixed-point ops stored in a pre_export artifact (files already digest-checked)."""
    try:
        meta = json.loads(ctx.run.path(art.tables_file).read_text())
        arrays = safetensors.numpy.load_file(
            str(ctx.run.path(art.tables_file.replace(".json", ".safetensors")))
        )
        return {
            m["layer_id"]: FixedPointOp(
                m["layer_id"],
                m["onnx_op"],
                m["attrs"],
                {k: arrays[f"{m['layer_id']}/{k}"] for k in m["initializers"]},
                m["in_scale"],
                m["in_dtype"],
                m["out_scale"],
                m["out_dtype"],
            )
            for m in meta
        }
    except (OSError, KeyError, ValueError) as e:
        raise ArtifactError(
            f"cannot read the pre_export tables ({e})",
            where=art.tables_file,
            hint="rerun pre_export",
        ) from e


def load_qat_export(art: QatExportModel, ctx: RunContext):
    """The qat.export model: the QAT graph with the stored tables swapped in."""
    gm = load_qat(art, ctx)
    rewrite(gm, load_tables(ctx, art))
    return gm


def render_tables(candidates, built, skipped: dict[str, str]) -> str:
    """debug/lut_tables.txt: per table its op, dtypes, size and max error."""
    lines = ["# layer_id | table | op | in->out dtype | kind | size | max_err_steps | max_abs_err"]
    for c in candidates:
        _, payload = built[c.layer_id]
        for name, table, fn, domain in _tables_of(c, payload):
            e = max_error(table, fn, domain=domain)
            lines.append(
                f"{c.layer_id} | {name} | {e['op']} | {e['in_dtype']}->{e['out_dtype']}"
                f" | {e['kind']} | {e['size']} | {e['max_err_steps']:.3g}"
                f" | {e['max_abs_err']:.3g}"
            )
    lines += ["", "# kept as float ops (layer_id | reason)"]
    lines += [f"{lid} | {why}" for lid, why in sorted(skipped.items())] or ["none"]
    return "\n".join(lines) + "\n"


def _tables_of(c, payload):
    """(name, LutTable, float reference, domain) of a payload: itself, or its inner tables.

    A table op is scored over its whole input range; a composite's inner tables (exp,
    reciprocal, rsqrt) over the domain they cover, where their inputs are kept.
    """
    if isinstance(payload, LutTable):
        return [("table", payload, torch_fn(c.node), None)]
    inner = [(k, v) for k, v in vars(payload).items() if isinstance(v, LutTable)]
    return [
        (k, t, REFERENCE_FNS[t.op], (t.bounds[0] * t.in_scale, t.bounds[-1] * t.in_scale))
        for k, t in inner
        if t.op in REFERENCE_FNS
    ]
