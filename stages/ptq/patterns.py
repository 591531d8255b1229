"""Exporter idioms the optimized stage fuses into one op (the vendor's pattern fusion).

Each pattern is anchored on one node and walks the nodes exporters write after it; every
inner tensor must be read by the pattern alone (not by another node, not a graph output)
and every constant must be an initializer (``fold_constants`` runs first) equal to the
idiom's value (relative tolerance :data:`~stages.ptq.pattern_match.RTOL`):

- ``layernorm`` (torch's TorchScript exporter below opset 17, tf2onnx):
  ``m = ReduceMean(x, axes)``, ``d = Sub(x, m)``, ``Pow(d, 2)`` or ``Mul(d, d)``,
  ``ReduceMean(axes)``, ``Add eps``, ``Sqrt``, ``Div(d, .)`` or ``Mul(d, Reciprocal(.))``,
  then optionally ``Mul gamma`` and ``Add beta`` (constants broadcasting to the normalized
  dims) -> ``LayerNormalization(x, gamma, beta, axis, epsilon)``; ``axes`` must be the
  trailing axes ``[axis, rank)`` without the batch, both ReduceMeans keeping their dims;
- ``gelu`` (torch, tf2onnx): ``Erf(x / sqrt(2))`` (or ``x * (1 / sqrt(2))``) ``+ 1``, times
  ``x`` and ``0.5`` in any order of the two Muls -> ``Gelu`` (opset 20; the PTQ chain runs
  at opset 21 and the ptq stage makes Gelu one lookup table); its tanh approximation
  ``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (the cube as ``Pow(x, 3)``
  or two Muls) -> ``Gelu(approximate="tanh")`` (:mod:`stages.ptq.pattern_act`);
- ``hardswish`` (paddle2onnx): ``x * Clip(x + 3, 0, 6) / 6`` (``Div`` by 6 or ``Mul`` by
  1/6, before or after the product), ``x * HardSigmoid(x)`` with alpha 1/6 and beta 0.5
  -> ``HardSwish`` (one lookup table).

Each is exact in float (the same function, constants within the tolerance). The fused
node takes the first replaced node's layer id and writes the last one's output tensor, so
the equivalence check compares it there. A pattern only partly matched (its anchor and
first step matched, a later node did not) stays as it was and is reported with the node
that broke it and why.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from stages.ptq.graph import attr, layer_of
from stages.ptq.pattern_act import gelu, gelu_tanh, hardswish_clip, hardswish_sigmoid
from stages.ptq.pattern_match import (
    Broken,
    Graph,
    Nodes,
    PatternMatch,
    new_const,
    other,
    splice,
)


def _axes(g: Graph, node: onnx.NodeProto) -> list[int] | None:
    """ReduceMean's axes (opset 18+: input 1; before: the attribute), None for all."""
    if len(node.input) > 1 and node.input[1]:
        v = g.const(node.input[1])
        if v is None:
            raise Broken(node, "axes are not a constant")
        return [int(a) for a in v.reshape(-1)]
    axes = attr(node, "axes")
    return list(axes) if axes else None


def _trailing(g: Graph, node: onnx.NodeProto, x: str) -> int:
    """The LayerNormalization axis of ReduceMean ``node`` over ``x`` (Broken if its axes are
    not the trailing ones, include the batch, or drop dims)."""
    rank, axes = len(g.dims.get(x, [])), _axes(g, node)
    if not rank or axes is None:
        raise Broken(node, "reduces over all axes or the input rank is unknown")
    norm = sorted(a % rank for a in axes)
    if norm != list(range(rank - len(norm), rank)) or norm[0] == 0 or not attr(node, "keepdims", 1):
        raise Broken(node, f"ReduceMean axes {axes} (keepdims {attr(node, 'keepdims', 1)}): "
                     "expected the trailing axes, without the batch, dims kept")  # fmt: skip
    return norm[0]


def layernorm(g: Graph, mean: onnx.NodeProto, seen: Nodes):
    """The decomposed LayerNorm anchored on its first ReduceMean (module docstring)."""
    x = mean.input[0]
    sub = next((n for n in g.readers.get(mean.output[0], []) if n.op_type == "Sub"
                and list(n.input) == [x, mean.output[0]]), None)  # fmt: skip
    if sub is None:
        return None
    seen += [mean, sub]
    axis = _trailing(g, mean, x)
    g.next(mean, "Sub")
    square, eps, sqrt = _std(g, mean, sub, axis, seen)
    norm = _normalize(g, sqrt, sub.output[0], seen)
    if {id(n) for n in g.readers_of(sub.output[0])} != {id(square), id(seen[-1])}:
        raise Broken(sub, "the centred x is read by nodes outside the pattern")
    return _affine(g, x, axis, eps, seen, norm)


def _std(
    g: Graph, mean, sub, axis: int, seen: Nodes
) -> tuple[onnx.NodeProto, float, onnx.NodeProto]:
    """``Sqrt(ReduceMean(d^2) + eps)`` after the centred x: (the square, eps, the Sqrt)."""
    square = _square(g, sub)
    seen.append(square)
    var = g.next(square, "ReduceMean")
    seen.append(var)
    axes, want = _axes(g, var), _axes(g, mean)
    if _trailing(g, var, square.output[0]) != axis or sorted(axes) != sorted(want):
        raise Broken(var, f"ReduceMean axes {axes}, expected {want} (the mean's)")
    add = g.next(var, "Add")
    seen.append(add)
    eps = g.scalar(other(add, var.output[0]))
    if eps is None or eps < 0:
        raise Broken(add, "adds no constant scalar epsilon >= 0")
    sqrt = g.next(add, "Sqrt")
    seen.append(sqrt)
    return square, eps, sqrt


def _square(g: Graph, sub: onnx.NodeProto) -> onnx.NodeProto:
    """``Pow(d, 2)`` or ``Mul(d, d)`` reading the centred x."""
    d = sub.output[0]
    for n in g.readers.get(d, []):
        if n.op_type == "Pow" and n.input[0] == d:
            g.expect(n, n.input[1], 2.0, "exponent")
            return n
        if n.op_type == "Mul" and list(n.input) == [d, d]:
            return n
    raise Broken(sub, "no Pow(d, 2) or Mul(d, d) reads the centred x")


def _normalize(g: Graph, sqrt: onnx.NodeProto, d: str, seen: Nodes) -> onnx.NodeProto:
    """``Div(d, std)`` or ``Mul(d, Reciprocal(std))``; the node writing the normalized x."""
    step = g.next(sqrt, "Div", "Reciprocal")
    seen.append(step)
    if step.op_type == "Div":
        if list(step.input) != [d, sqrt.output[0]]:
            raise Broken(step, "divides something other than the centred x by the std")
        return step
    mul = g.next(step, "Mul")
    seen.append(mul)
    if other(mul, step.output[0]) != d:
        raise Broken(mul, "multiplies 1/std by something other than the centred x")
    return mul


def _affine(g: Graph, x: str, axis: int, eps: float, seen: Nodes, norm: onnx.NodeProto):
    """The Mul gamma / Add beta after the normalization (when constant and of the normalized
    dims), then the LayerNormalization node."""
    dims = g.dims.get(x, [])[axis:]
    if not dims or None in dims:
        raise Broken(seen[0], f"normalized dims {dims} are not static")
    params, last = [np.ones(dims, np.float32), np.zeros(dims, np.float32)], norm
    for k, op in enumerate(("Mul", "Add")):
        readers = g.readers_of(last.output[0])
        step = readers[0] if len(readers) == 1 and readers[0] is not None else None
        value = _param(g, step, last, op, dims)
        if value is None:
            break
        params[k], last = value, step
        seen.append(step)
    model, lid = g.model, layer_of(seen[0])
    names = [new_const(model, f"{lid}.{p}", v.copy())
             for p, v in zip(("weight", "bias"), params, strict=True)]  # fmt: skip
    new = helper.make_node("LayerNormalization", [x, *names], [last.output[0]], axis=axis,
                           epsilon=float(eps))  # fmt: skip
    return seen, new


def _param(g: Graph, step, last: onnx.NodeProto, op: str, dims: list[int]) -> np.ndarray | None:
    """The constant ``step`` (a Mul or Add of ``last``) applies, as an array of ``dims``;
    None when ``step`` is no such op or its constant would broadcast beyond ``dims``."""
    if step is None or step.op_type != op:
        return None
    value = g.const(other(step, last.output[0]))
    if value is None:
        return None
    lead = value.shape[: max(0, value.ndim - len(dims))]
    if any(s != 1 for s in lead):
        return None
    try:
        return np.broadcast_to(value.reshape(value.shape[len(lead) :]), dims).astype(np.float32)
    except ValueError:
        return None


RULES = (
    ("layernorm", "ReduceMean", layernorm),
    ("gelu", "Erf", gelu),
    ("gelu", "Tanh", gelu_tanh),
    ("hardswish", "Clip", hardswish_clip),
    ("hardswish", "HardSigmoid", hardswish_sigmoid),
)
"""(pattern, anchor op, rule): a rule returns None when its anchor starts no instance,
(nodes, new node) when it matched, and raises Broken when only partly matched."""


def fuse_patterns(model: onnx.ModelProto, removed: dict[str, str]) -> list[PatternMatch]:
    """Fuse every instance of :data:`RULES` in ``model`` (in place); every instance, fused
    or partly matched, in the order found. ``removed`` gets each replaced layer but the
    first (whose id the fused node keeps)."""
    found: list[PatternMatch] = []
    g = Graph(model)
    for pattern, op, rule in RULES:
        for anchor in [n for n in model.graph.node if n.op_type == op]:
            if not any(n is anchor for n in model.graph.node):
                continue  # replaced by an earlier instance
            seen: Nodes = []
            try:
                matched = rule(g, anchor, seen)
            except Broken as e:
                ids = tuple(dict.fromkeys(layer_of(n) for n in seen))
                found.append(PatternMatch(pattern, ids, broken=f"node {layer_of(e.node)}: {e.why}"))
                continue
            if matched is not None:
                ids = splice(model, *matched)
                for lid in ids[1:]:
                    removed[lid] = f"fused into {matched[1].op_type} {ids[0]} ({pattern})"
                found.append(PatternMatch(pattern, tuple(ids), matched[1].op_type, ids[-1]))
                g.refresh()
    return found
