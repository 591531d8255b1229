"""Floating-point operations per layer, for the flops column of the sensitive-ops file.

flops = 2 x MACs (one multiply and one add per multiply-accumulate), per sample:

- conv, linear: MACs = elements of the output x (weight elements / output channels), i.e.
  ``C_in / groups x kernel`` for a conv and ``in_features`` for a linear; the weight's
  shape is read from the header of prepare's float.safetensors (no tensor is loaded);
- matmul: MACs = elements of the output x K, K the last dimension of its first input
  (the producing layer's captured shape);
- every other op: 0 (no multiply-accumulate).

A layer whose shape or weight is not known has no entry (the file shows ``-``). Shapes
come from every compared pair (:func:`union_shapes`), so shares are of the whole model.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

from schemas.fileio import parse_json
from schemas.store import Run

WEIGHT_FILE = "artifacts/prepare/float.safetensors"


def weight_shapes(run: Run) -> dict[str, tuple[int, ...]]:
    """Graph node name of each parameter (dots as underscores) -> its shape; {} without
    the file (a PTQ chain)."""
    path = run.path(WEIGHT_FILE)
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = parse_json(f.read(size))
    except (OSError, ValueError, struct.error):
        return {}
    return {
        k.replace(".", "_"): tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"
    }


def layer_flops(run: Run, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Layer id -> flops for one sample, for the layers of ``shapes`` (module docstring)."""
    try:
        records = parse_json(run.path("artifacts/prepare/layers.json").read_text())
    except (OSError, ValueError):
        return {}
    weights = weight_shapes(run)
    layer_of = {r["node"]: r["layer_id"] for r in records}
    out = {}
    for r in records:
        lid = r["layer_id"]
        if r["merged_into"] or lid not in shapes:
            continue
        macs = _macs(r, shapes, weights, layer_of)
        if macs is not None:
            out[lid] = 2 * macs
    return out


def _macs(record: dict, shapes: dict, weights: dict, layer_of: dict) -> int | None:
    """Multiply-accumulates of one layer; None when a needed shape is unknown."""
    out_elems = math.prod(shapes[record["layer_id"]])
    if record["op_type"] in ("conv", "linear"):
        w = next((weights[i] for i in record["inputs"] if len(weights.get(i, ())) >= 2), None)
        return None if w is None else out_elems * math.prod(w) // w[0]
    if record["op_type"] == "matmul":
        first = layer_of.get(record["inputs"][0]) if record["inputs"] else None
        return out_elems * shapes[first][-1] if first in shapes else None
    return 0


def union_shapes(shape_maps: Iterable[dict[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """Every layer's one-sample shape over all compared pairs (each pair's
    ``PairResult.shapes``): a pair of the compiled program lacks the convs fused into
    their relu, and the vendor's share is of the whole model's flops, not of one pair's."""
    out: dict[str, tuple[int, ...]] = {}
    for shapes in shape_maps:
        for lid, shape in shapes.items():
            out.setdefault(lid, shape)
    return out


def render_flops(lid: str, flops: dict[str, int]) -> str:
    """The vendor's ``N(x.xx%)``: the layer's flops and its share of all layers' flops."""
    if lid not in flops:
        return "-"
    total = sum(flops.values())
    return f"{flops[lid]}({100 * flops[lid] / total if total else 0.0:.2f}%)"
