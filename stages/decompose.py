"""Attention as the BPU runs it: ``scaled_dot_product_attention`` written out.

torch.export keeps ``F.scaled_dot_product_attention`` (and ``nn.MultiheadAttention``,
which calls it) as one op, which has no BPU form: left whole it is a float island and its
softmax never gets pre_export's fixed-point table. :func:`decompose_attention` rewrites it,
on the exported graph before canonical ids are assigned, into the ops a user would write:
``softmax((q @ k^T) * scale + mask) @ v``, each of which the chain quantizes and runs on
integers (QMatMul, QRequant, QAdd, the Softmax table). Variants without that form (dropout,
a boolean or causal mask, grouped-query attention) stay whole.
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
        new = graph.call_function(target, args)
        vals = [x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args]
        with q.meta["val"].fake_mode:
            new.meta = dict(node.meta, val=target(*vals))
        return new

    s = op(aten.mul.Tensor, op(aten.matmul.default, q, op(aten.transpose.int, k, -2, -1)), scale)
    if a.get("attn_mask") is not None:
        s = op(aten.add.Tensor, s, a["attn_mask"])
    return op(aten.matmul.default, op(aten.softmax.int, s, -1), v)
