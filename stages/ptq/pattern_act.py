"""The activation patterns of :mod:`stages.ptq.patterns`: GELU (Erf and tanh forms) and
hardswish, as exporters write them (the idioms are listed there)."""

from __future__ import annotations

import math

import onnx
from onnx import helper

from stages.ptq.graph import attr
from stages.ptq.pattern_match import Broken, Graph, Nodes, is_const, other

KAPPA = 0.044715
"""The cube's coefficient of the tanh approximation of GELU."""


def gelu(g: Graph, erf: onnx.NodeProto, seen: Nodes):
    """``0.5 * x * (1 + Erf(x / sqrt(2)))`` anchored on its Erf (module docstring)."""
    readers = g.readers_of(erf.output[0])
    if len(readers) != 1 or readers[0] is None or readers[0].op_type != "Add":
        return None
    add = readers[0]
    seen += [erf, add]
    if not is_const(g, other(add, erf.output[0]), 1.0):
        raise Broken(add, "adds something other than the constant 1")
    scale, x = _erf_input(g, erf)
    seen.insert(0, scale)
    final = _times_half_x(g, add, x, seen)
    if len(g.readers_of(scale.output[0])) != 1:
        raise Broken(scale, "x / sqrt(2) is read by nodes outside the pattern")
    return seen, helper.make_node("Gelu", [x], [final.output[0]])


def gelu_tanh(g: Graph, tanh: onnx.NodeProto, seen: Nodes):
    """``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` anchored on its Tanh,
    the cube as ``Pow(x, 3)``, ``x * (x * x)`` or ``(x * x) * x``."""
    readers = g.readers_of(tanh.output[0])
    if len(readers) != 1 or readers[0] is None or readers[0].op_type != "Add":
        return None
    add = readers[0]
    if not is_const(g, other(add, tanh.output[0]), 1.0):
        return None  # a Tanh + something else: not this idiom's start
    seen += [tanh, add]
    x = _tanh_input(g, tanh, seen)
    final = _times_half_x(g, add, x, seen)
    return seen, helper.make_node("Gelu", [x], [final.output[0]], approximate="tanh")


def _tanh_input(g: Graph, tanh: onnx.NodeProto, seen: Nodes) -> str:
    """x of ``Tanh(beta * (x + kappa * x^3))``; the nodes walked go into ``seen``."""
    scale = _made(g, tanh, tanh.input[0], "Mul")
    beta = [i for i in scale.input if is_const(g, i, math.sqrt(2 / math.pi))]
    if len(beta) != 1:
        raise Broken(scale, "Mul factor is not the constant sqrt(2/pi)")
    plus = _made(g, scale, other(scale, beta[0]), "Add")
    terms = [i for i in plus.input if _kappa(g, g.made.get(i)) is not None]
    if len(terms) != 1:
        raise Broken(plus, "adds no 0.044715 * x^3 to x")
    kappa, x = g.made[terms[0]], other(plus, terms[0])
    cube = other(kappa, _kappa(g, kappa))
    inner = [scale, plus, kappa, *_cube(g, kappa, cube, x)]
    seen += inner
    for n in inner:
        if len(g.readers_of(n.output[0])) != 1:
            raise Broken(n, "its output is read by nodes outside the pattern")
    return x


def _times_half_x(g: Graph, add: onnx.NodeProto, x: str, seen: Nodes) -> onnx.NodeProto:
    """The Muls of ``1 + erf`` by ``x`` and ``0.5``: ``(s * x) * 0.5``, ``(s * 0.5) * x``
    or ``s * (0.5 * x)`` (either operand order); the node writing the product."""
    m1 = g.next(add, "Mul")
    seen.append(m1)
    o = other(m1, add.output[0])
    if o == x or is_const(g, o, 0.5):
        m2 = g.next(m1, "Mul")
        seen.append(m2)
        rest = other(m2, m1.output[0])
        if (o == x and not is_const(g, rest, 0.5)) or (o != x and rest != x):
            raise Broken(m2, f"multiplies by {rest}, expected {'0.5' if o == x else x}")
        return m2
    half = g.made.get(o)
    if (half is None or half.op_type != "Mul" or x not in half.input
            or not is_const(g, other(half, x), 0.5)):  # fmt: skip
        raise Broken(m1, f"multiplies 1 + erf by {o}, expected x, 0.5 or 0.5 * x")
    if len(g.readers_of(o)) != 1:
        raise Broken(half, "0.5 * x is read by nodes outside the pattern")
    seen.append(half)
    return m1


def _made(g: Graph, reader: onnx.NodeProto, name: str, op: str) -> onnx.NodeProto:
    """The ``op`` node writing ``name`` (an input of ``reader``), else Broken at ``reader``."""
    node = g.made.get(name)
    if node is None or node.op_type != op:
        raise Broken(reader, f"input {name} is not written by a {op}")
    return node


def _kappa(g: Graph, node: onnx.NodeProto | None) -> str | None:
    """The input of Mul ``node`` holding the constant 0.044715, else None."""
    if node is None or node.op_type != "Mul":
        return None
    return next((i for i in node.input if is_const(g, i, KAPPA)), None)


def _cube(g: Graph, reader: onnx.NodeProto, name: str, x: str) -> Nodes:
    """The nodes writing ``name = x^3``: ``Pow(x, 3)``, ``Mul(x, Mul(x, x))`` (any order)."""
    node = g.made.get(name)
    if node is not None and node.op_type == "Pow" and node.input[0] == x:
        g.expect(node, node.input[1], 3.0, "exponent")
        return [node]
    if node is not None and node.op_type == "Mul" and x in node.input:
        square = g.made.get(other(node, x))
        if square is not None and square.op_type == "Mul" and list(square.input) == [x, x]:
            return [node, square]
    raise Broken(reader, f"multiplies {name}, expected x^3 of {x}")


def _erf_input(g: Graph, erf: onnx.NodeProto) -> tuple[onnx.NodeProto, str]:
    """(the node scaling x by 1/sqrt(2), x): ``Div(x, sqrt 2)`` or ``Mul(x, 1/sqrt 2)``."""
    scale = g.made.get(erf.input[0])
    if scale is not None and scale.op_type == "Div":
        g.expect(scale, scale.input[1], math.sqrt(2.0), "divisor")
        return scale, scale.input[0]
    if scale is not None and scale.op_type == "Mul":
        for k in (0, 1):
            if is_const(g, scale.input[1 - k], math.sqrt(0.5)):
                return scale, scale.input[k]
        raise Broken(scale, "Mul factor is not the constant 1/sqrt(2)")
    raise Broken(erf, "its input is not x / sqrt(2) (a Div or Mul by a constant)")


def hardswish_clip(g: Graph, clip: onnx.NodeProto, seen: Nodes):
    """``x * Clip(x + 3, 0, 6) / 6`` anchored on its Clip of ``x + constant``."""
    add = g.made.get(clip.input[0])
    if add is None or add.op_type != "Add" or all(g.scalar(i) is None for i in add.input):
        return None
    seen += [add, clip]
    shift = next(i for i in add.input if g.scalar(i) is not None)
    g.expect(add, shift, 3.0, "adds")
    x = other(add, shift)
    for k, want, what in ((1, 0.0, "min"), (2, 6.0, "max")):
        got = g.scalar(clip.input[k]) if len(clip.input) > k and clip.input[k] else None
        if got != want:
            raise Broken(clip, f"Clip {what} {got}, expected {want:g}")
    if len(g.readers_of(add.output[0])) != 1:
        raise Broken(add, "x + 3 is read by nodes outside the pattern")
    first = g.next(clip, "Mul", "Div")
    seen.append(first)
    second = g.next(first, "Mul", "Div")
    seen.append(second)
    if _times_x(first, clip, x):  # (x * clip) / 6
        _by_six(g, second, first)
    else:  # x * (clip / 6)
        _by_six(g, first, clip)
        if not _times_x(second, first, x):
            raise Broken(
                second, f"{second.op_type} by {other(second, first.output[0])}, expected x"
            )
    return seen, helper.make_node("HardSwish", [x], [second.output[0]])


def _times_x(node: onnx.NodeProto, prev: onnx.NodeProto, x: str) -> bool:
    return node.op_type == "Mul" and other(node, prev.output[0]) == x


def _by_six(g: Graph, node: onnx.NodeProto, prev: onnx.NodeProto) -> None:
    """Broken unless ``node`` divides ``prev``'s output by 6 or multiplies it by 1/6."""
    if node.op_type == "Div" and node.input[0] == prev.output[0]:
        g.expect(node, node.input[1], 6.0, "divisor")
    elif node.op_type == "Mul":
        g.expect(node, other(node, prev.output[0]), 1.0 / 6.0, "factor")
    else:
        raise Broken(node, "divides by something other than 6")


def hardswish_sigmoid(g: Graph, hs: onnx.NodeProto, seen: Nodes):
    """``x * HardSigmoid(x)`` (alpha 1/6, beta 0.5) anchored on its HardSigmoid."""
    x, readers = hs.input[0], g.readers_of(hs.output[0])
    if len(readers) != 1 or readers[0] is None or readers[0].op_type != "Mul":
        return None
    mul = readers[0]
    if other(mul, hs.output[0]) != x:
        return None  # a gate of another tensor (squeeze-excite), not hardswish
    seen += [hs, mul]
    for name, want in (("alpha", 1.0 / 6.0), ("beta", 0.5)):
        got = attr(hs, name, 0.2 if name == "alpha" else 0.5)
        if abs(got - want) > 1e-6 * want:
            raise Broken(hs, f"HardSigmoid {name} {got:g}, expected {want:g}")
    return seen, helper.make_node("HardSwish", [x], [mul.output[0]])
