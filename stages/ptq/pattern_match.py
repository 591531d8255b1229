"""What the pattern rules of :mod:`stages.ptq.patterns` walk: a read-only view of the
graph (producers, readers, constants, inferred dims), the exception that says where a
pattern stopped matching, and the splice that replaces the matched nodes by one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from stages.ptq.graph import layer_of, producers, set_layer, users

Nodes = list[onnx.NodeProto]
RTOL = 1e-6
"""Relative tolerance of a pattern's constants (paddle2onnx writes 1/6 as 0.1666667)."""


@dataclass(frozen=True)
class PatternMatch:
    """One pattern instance: fused (true) or partly matched (``broken`` says where)."""

    pattern: str
    nodes: tuple[str, ...]  # layer ids replaced (or matched before the break)
    op: str = ""  # the fused node's op
    last: str = ""  # layer id of the last replaced node: its output is the fused node's
    broken: str = ""  # "node <layer id>: why"

    def __bool__(self) -> bool:
        return not self.broken


class Broken(Exception):
    """A partly matched pattern: ``node`` is where it stopped matching, ``why`` says how."""

    def __init__(self, node: onnx.NodeProto, why: str):
        super().__init__(why)
        self.node, self.why = node, why


class Graph:
    """The model as the rules read it: producers, readers, constants and dims."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.refresh()
        inferred = onnx.shape_inference.infer_shapes(model).graph
        self.dims = {
            v.name: [d.dim_value if d.HasField("dim_value") else None
                     for d in v.type.tensor_type.shape.dim]
            for v in [*inferred.input, *inferred.value_info, *inferred.output]
            if v.type.tensor_type.HasField("shape")
        }  # fmt: skip

    def refresh(self) -> None:
        """Re-read producers, readers and constants after a splice (the dims stay: a fused
        node writes the tensor its last node wrote)."""
        g = self.model.graph
        self.made, self.readers = producers(g), users(g)
        self.tensors = {i.name: i for i in g.initializer}  # converted on use: models are big
        self.outputs = {o.name for o in g.output}

    def readers_of(self, name: str) -> list[onnx.NodeProto | None]:
        """The distinct nodes reading tensor ``name`` (None for a graph output)."""
        seen = {id(n): n for n in self.readers.get(name, [])}
        return [*seen.values(), *([None] if name in self.outputs else [])]

    def next(self, node: onnx.NodeProto, *ops: str) -> onnx.NodeProto:
        """The single reader of ``node``'s output, one of ``ops`` (else Broken)."""
        found = self.readers_of(node.output[0])
        if len(found) != 1 or found[0] is None:
            raise Broken(node, f"output read by {len(found)} nodes or the graph output, "
                         f"expected one {'/'.join(ops)}")  # fmt: skip
        if found[0].op_type not in ops:
            raise Broken(found[0], f"{found[0].op_type}, expected {'/'.join(ops)}")
        return found[0]

    def const(self, name: str) -> np.ndarray | None:
        """The value of initializer ``name``, else None."""
        t = self.tensors.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant, else None."""
        t = self.tensors.get(name)
        if t is None or int(np.prod(t.dims)) != 1:
            return None
        return float(numpy_helper.to_array(t).reshape(-1)[0])

    def expect(self, node: onnx.NodeProto, name: str, want: float, what: str) -> None:
        """Broken at ``node`` unless ``name`` is a one-element constant equal to ``want``."""
        v = self.scalar(name)
        if v is None or abs(v - want) > RTOL * abs(want):
            got = "not a constant scalar" if v is None else f"{v:g}"
            raise Broken(node, f"{node.op_type} {what} {got}, expected {want:g}")


def other(node: onnx.NodeProto, name: str) -> str:
    """The input of binary ``node`` that is not ``name`` (its second when both are)."""
    return node.input[1] if node.input[0] == name else node.input[0]


def is_const(g: Graph, name: str, want: float) -> bool:
    v = g.scalar(name)
    return v is not None and abs(v - want) <= RTOL * abs(want)


def new_const(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    """A new initializer holding ``value``, named ``name`` or ``name#k`` if taken."""
    taken = {i.name for i in model.graph.initializer}
    out, k = name, 1
    while out in taken:
        out, k = f"{name}#{k}", k + 1
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), out))
    return out


def splice(model: onnx.ModelProto, nodes: list[onnx.NodeProto], new: onnx.NodeProto) -> list:
    """Put ``new`` where the last of ``nodes`` was, drop ``nodes``; ``new`` gets the first
    node's name and layer id. Returns the replaced nodes' layer ids in graph order."""
    order = {id(n): k for k, n in enumerate(model.graph.node)}
    nodes = sorted(nodes, key=lambda n: order[id(n)])
    new.name = nodes[0].name
    set_layer(new, layer_of(nodes[0]))
    model.graph.node.insert(order[id(nodes[-1])] + 1, new)
    for n in nodes:
        model.graph.node.remove(n)
    return [layer_of(n) for n in nodes]
