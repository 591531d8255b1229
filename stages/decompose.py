"""Attention as the BPU runs it: ``scaled_dot_product_attention`` and ``einsum`` written out.

torch.export keeps ``F.scaled_dot_product_attention`` (and ``nn.MultiheadAttention``,
which calls it) as one op, which has no BPU form: left whole it is a float island and its
softmax never gets pre_export's fixed-point table. :func:`decompose_attention` rewrites it,
on the exported graph before canonical ids are assigned, into the ops a user would write:
``softmax((q @ k^T) * scale + mask) @ v``, each of which the chain quantizes and runs on
integers (QMatMul, QRequant, QAdd, the Softmax table). Variants without that form (dropout,
a boolean or causal mask, grouped-query attention) stay whole. :func:`einsum_to_matmul`
does the same for a two-operand einsum that is a batched matrix product
(``"bhqd,bhkd->bhqk"``): a matmul, with a transpose where an operand is stored the other
way round; other equations stay Einsum (a float island).
"""

from __future__ import annotations

import math

import torch
import torch.fx

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


def decompose_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite every plain sdpa node; returns how many were rewritten."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is SDPA and _plain(node):
            with gm.graph.inserting_before(node):
                out = _written_out(gm.graph, node)
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            count += 1
    if count:
        gm.recompile()
    return count


def einsum_to_matmul(gm: torch.fx.GraphModule) -> int:
    """Rewrite every einsum that is a batched matrix product; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.einsum.default:
            continue
        plan = _matmul_plan(node.args[0], len(node.args[1]))
        if plan is None:
            continue
        (a, b), (swap_a, swap_b) = node.args[1], plan
        with gm.graph.inserting_before(node):
            a, b = (_op(gm.graph, node, aten.transpose.int, x, -2, -1) if swap else x
                    for x, swap in ((a, swap_a), (b, swap_b)))  # fmt: skip
            out = _op(gm.graph, node, aten.matmul.default, a, b)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count


def _matmul_plan(equation: str, n: int) -> tuple[bool, bool] | None:
    """For ``batch+ij, batch+jk -> batch+ik`` (each operand possibly transposed): whether
    to transpose the first and the second operand; None for any other equation."""
    if n != 2 or "->" not in equation or "." in equation:
        return None
    ins, out = equation.replace(" ", "").split("->")
    a, b = ins.split(",")
    batch = out[:-2]
    if len(a) != len(b) or len(a) != len(out) or a[:-2] != batch or b[:-2] != batch:
        return None
    i, k = out[-2:]
    j = ({*a[-2:]} - {i}).pop() if i in a[-2:] and len({*a[-2:]}) == 2 else None
    if j is None or {*b[-2:]} != {j, k} or len({i, j, k}) < 3 or {i, j, k} & {*batch}:
        return None
    return a[-2:] == j + i, b[-2:] == k + j


def _op(graph: torch.fx.Graph, like: torch.fx.Node, target, *args) -> torch.fx.Node:
    """A new node of ``target`` with ``like``'s module stack and source line, and the
    traced value its arguments give."""
    new = graph.call_function(target, args)
    vals = [x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args]
    mode = next(v.fake_mode for v in vals if hasattr(v, "fake_mode"))
    with mode:
        new.meta = dict(like.meta, val=target(*vals))
    return new


def _args(node: torch.fx.Node) -> dict:
    names = [a.name for a in SDPA._schema.arguments]
    args = {a.name: a.default_value for a in SDPA._schema.arguments if a.has_default_value()}
    return args | dict(zip(names, node.args, strict=False)) | dict(node.kwargs)


def _plain(node: torch.fx.Node) -> bool:
    """No dropout, causal mask or GQA; a mask, if any, additive (float)."""
    a = _args(node)
    mask = a.get("attn_mask")
    float_mask = mask is None or (
        isinstance(mask, torch.fx.Node) and mask.meta["val"].is_floating_point()
    )
    return (
        not a.get("dropout_p")
        and not a.get("is_causal")
        and not a.get("enable_gqa")
        and (float_mask)
    )


def _written_out(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node:
    """The sdpa node's ops, each with the node's module stack and source line."""
    a = _args(node)
    q, k, v = a["query"], a["key"], a["value"]
    scale = a.get("scale") or 1 / math.sqrt(q.meta["val"].shape[-1])

    def op(target, *args):
        return _op(graph, node, target, *args)

    s = op(aten.mul.Tensor, op(aten.matmul.default, q, op(aten.transpose.int, k, -2, -1)), scale)
    if a.get("attn_mask") is not None:
        s = op(aten.add.Tensor, s, a["attn_mask"])
    return op(aten.matmul.default, op(aten.softmax.int, s, -1), v)
