"""``qparity verify A B -i input.npy``: the vendor's hb_verifier for any two models.

A model is a stage of a run (``RUN_ID:stage``, compared by canonical layer id, integer
stages dequantized) or a file: an ONNX graph (every node output can be compared) or a
``.hbm`` program (outputs only, as the vendor's tool says of hbm). Pairs where both sides
expose their nodes get per-node cosine similarity (NodeName, TensorName, cosine); every pair
gets output consistency (OutputName, Consistency = allclose at atol 10**-digits, Mismatched
Elements, Max Abs Diff, Max Rel Diff). The advice follows the vendor's three cases: all
cosines normal (>= 0.99) -> check the evaluation's preprocessing; all abnormal from the
first node -> check the input data and its format; some abnormal -> compare stage by stage
from the first abnormal node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schemas.errors import QparityError, SpecError

NORMAL, BROKEN = 0.99, 0.8
"""The vendor's reading of cosine similarity: >= 0.99 normal, < 0.8 broken."""


@dataclass
class Side:
    """One model to verify: a name, a runner, and whether its nodes can be compared."""

    name: str
    run: object  # callable: x -> (outputs list, {tensor name: value}, {tensor: node name})
    per_node: bool


@dataclass
class Verdict:
    nodes: list[dict]
    outputs: list[dict]
    advice: str


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """<a, b> / (|a| |b|) over the flattened tensors (1.0 when both are zero)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb)) if na and nb else 0.0


def consistency(a: np.ndarray, b: np.ndarray, digits: int) -> dict:
    """Output consistency at ``atol = 10**-digits`` (the vendor's columns)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise SpecError(
            f"outputs have shapes {a.shape} and {b.shape}",
            where="verify",
            hint="compare models of the same network and input",
        )
    diff = np.abs(a - b)
    atol = 10.0**-digits
    rel = diff / np.maximum(np.abs(a), 1e-12)
    return {
        "Consistency": bool(np.all(diff <= atol)),
        "Mismatched Elements": int(np.sum(diff > atol)),
        "Max Abs Diff": float(diff.max(initial=0.0)),
        "Max Rel Diff": float(rel.max(initial=0.0)),
    }


def verify(a: Side, b: Side, x: np.ndarray, digits: int = 5) -> Verdict:
    """Compare ``a`` and ``b`` on input ``x``."""
    out_a, val_a, node_a = a.run(x)
    out_b, val_b, _ = b.run(x)
    nodes = []
    if a.per_node and b.per_node:
        for t in [t for t in val_a if t in val_b]:
            if np.shape(val_a[t]) == np.shape(val_b[t]):
                nodes.append({"NodeName": node_a.get(t, t), "TensorName": t,
                              "cosine": cosine(val_a[t], val_b[t])})  # fmt: skip
    if len(out_a) != len(out_b):
        raise SpecError(
            f"{a.name} has {len(out_a)} outputs, {b.name} has {len(out_b)}",
            where="verify",
            hint="compare two models of the same network",
        )
    outputs = [
        {"OutputName": f"output{i}", **consistency(oa, ob, digits), "cosine": cosine(oa, ob)}
        for i, (oa, ob) in enumerate(zip(out_a, out_b, strict=True))
    ]
    return Verdict(nodes, outputs, advice(nodes, outputs))


def advice(nodes: list[dict], outputs: list[dict]) -> str:
    """The vendor's three cases (its PTQ consistency guide)."""
    if not nodes:
        bad = [o["OutputName"] for o in outputs if o["cosine"] < NORMAL]
        if not bad:
            return "outputs agree: check the evaluation's input preprocessing (normalization, colour space, layout)"
        return f"outputs differ ({', '.join(bad)}): compare the stages in between node by node"
    abnormal = [n for n in nodes if n["cosine"] < NORMAL]
    if not abnormal and all(o["cosine"] >= NORMAL for o in outputs):
        return ("case 1, every node and output is normal: check the evaluation's input "
                "preprocessing (normalization, colour space, layout) against training")  # fmt: skip
    if abnormal and abnormal[0] is nodes[0] and len(abnormal) >= 0.9 * len(nodes):
        return "case 2, every node is abnormal: check the input data, its source and format"
    first = abnormal[0]["TensorName"] if abnormal else "the output"
    return (f"case 3, some nodes are abnormal from {first}: the error enters at a stage or "
            "an op there; compare the stages in between (qparity localize RUN)")  # fmt: skip


def load_input(path: Path) -> np.ndarray:
    """The input array of -i (a .npy file), float32."""
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise QparityError(
            f"cannot read the input ({e})", where=str(path), hint="give a .npy array (np.save)"
        ) from e
    return np.ascontiguousarray(x, dtype=np.float32 if x.dtype.kind == "f" else x.dtype)
