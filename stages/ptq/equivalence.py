"""The optimized stage's promise: every layer of the original model still computes the
same tensor (cosine >= the threshold, 0.999 by default), checked on probe samples."""

from __future__ import annotations

import numpy as np
import onnx

from schemas.errors import StageError
from stages.onnx_runner import OnnxRunner
from stages.ptq.graph import layer_of
from stages.ptq.pattern_match import PatternMatch


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """FORMULA: ``sum(a*b) / (|a| |b|)`` in float64; 1.0 when both are zero, 0.0 when one is."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def compare_layers(
    original: onnx.ModelProto, optimized: onnx.ModelProto, x: np.ndarray, removed: dict[str, str]
) -> list[tuple[str, str, float | None, str]]:
    """One row per layer of the original model: (layer, op, cosine or None, note)."""
    writer = {o: n for n in optimized.graph.node for o in n.output}
    kept = set(writer)
    now = {layer_of(n): n.output[0] for n in optimized.graph.node}
    pairs = [(n, n.output[0]) for n in original.graph.node]
    common = sorted({t for _, t in pairs if t in kept})
    _, ref = OnnxRunner(original).run_capture(x, common)
    _, got = OnnxRunner(optimized).run_capture(x, common)
    rows = []
    for node, t in pairs:
        lid = layer_of(node)
        if t in kept:
            w = writer[t]  # a fused node writes its last layer's tensor
            note = "" if layer_of(w) == lid else f"now written by {w.op_type} {layer_of(w)}"
            rows.append((lid, node.op_type, cosine(ref[t], got[t]), note))
        elif lid in removed:
            rows.append((lid, node.op_type, None, removed[lid]))
        else:
            note = f"fused: its output is now {now.get(lid, '?')} (compared there)"
            rows.append((lid, node.op_type, None, note))
    return rows


def check_rows(rows, threshold: float) -> float:
    """The smallest cosine; a StageError naming the first layer below ``threshold``."""
    values = [(lid, c) for lid, _, c, _ in rows if c is not None]
    for lid, c in values:
        if c < threshold:
            raise StageError(
                f"the optimized model changed layer {lid}: cosine {c:.6f} < {threshold}",
                where="optimized",
                hint="this is an optimizer bug: see debug/optimize_equivalence.txt, keep the run",
            )
    return min((c for _, c in values), default=1.0)


def render_rows(rows, threshold: float, patterns: list[PatternMatch] = ()) -> str:
    """debug/optimize_equivalence.txt: the per-layer rows, then the pattern instances."""
    lines = [f"# original vs optimized, per layer (threshold cosine >= {threshold})"]
    lines.append("# layer_id | op | cosine | note")
    for lid, op, c, note in rows:
        lines.append(f"{lid} | {op} | {'-' if c is None else f'{c:.6f}'} | {note}")
    lines += render_patterns(patterns, {lid: c for lid, _, c, _ in rows})
    return "\n".join(lines) + "\n"


def render_patterns(found: list[PatternMatch], cosines: dict) -> list[str]:
    """The pattern section of debug/optimize_equivalence.txt; ``cosines``: layer id -> its
    cosine in the per-layer comparison (a fused node is compared at its last layer)."""
    fused, partial = [m for m in found if m], [m for m in found if not m]
    out = ["", f"# patterns fused ({len(fused)}): pattern | new node | nodes replaced | cosine"]
    for m in fused:
        c = cosines.get(m.last)
        out.append(f"{m.pattern} | {m.op} {m.nodes[0]} | {', '.join(m.nodes)} | "
                   f"{'-' if c is None else f'{c:.6f}'}")  # fmt: skip
    out.append(f"# patterns partly matched, left unfused ({len(partial)}): "
               "pattern | nodes matched | where it broke")  # fmt: skip
    out += [f"{m.pattern} | {', '.join(m.nodes)} | {m.broken}" for m in partial]
    return out
