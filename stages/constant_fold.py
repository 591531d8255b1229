"""Fold the parts of an exported graph that depend on no input into buffers.

Models build constants in forward: swin's shifted-window attention mask is
``x.new_zeros((H, W))`` filled slice by slice in place, position grids come from
``arange``. Such a subgraph reads no input and no trainable parameter, so prepare runs it
once (in graph order, so in-place writes into views land where they would) and replaces
its values that the rest of the graph reads by buffers. Parameters are never folded: QAT
still trains them.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from stages.functionalize import RANDOM_OPS, erase_unused, functional_variant

# Ops whose tensor argument only gives the dtype/device of a new constant tensor.
_LIKE_OPS = frozenset({"new_zeros", "new_ones", "new_full", "new_tensor"})
FOLDED_PREFIX = "_qparity_const"


def fold_constants(gm: torch.fx.GraphModule) -> list[str]:
    """Replace input-independent values by buffers; returns the folded node names."""
    const = _constant_nodes(gm)
    if not const:
        return []
    values = _evaluate(gm, const)
    if values is None:
        return []
    folded = []
    for node in list(gm.graph.nodes):
        if node not in const or not isinstance(values.get(node), torch.Tensor):
            continue
        outside = [u for u in node.users if u not in const]
        if not outside:
            continue
        name = f"{FOLDED_PREFIX}_{len(folded)}"
        gm.register_buffer(name, values[node].detach().clone())
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta, val=values[node])
        for user in outside:
            user.replace_input_with(node, attr)
        folded.append(node.name)
    erase_unused(gm, const)
    return folded


def _constant_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """call_function nodes computed from buffers and literals only (no SymInt, no input)."""
    const: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "_opname", "") in RANDOM_OPS:
            continue
        inputs = node.all_input_nodes
        if getattr(node.target, "_opname", "") in _LIKE_OPS:
            inputs = inputs[1:] if inputs and inputs[0] is node.args[0] else inputs
        if all(_is_constant(gm, a, const) for a in inputs) and _has_tensor(node):
            const.add(node)
    return const


def _is_constant(gm, node: torch.fx.Node, const: set) -> bool:
    if node in const:
        return True
    if node.op != "get_attr":
        return False
    obj = operator.attrgetter(node.target)(gm)
    return isinstance(obj, torch.Tensor) and not isinstance(obj, torch.nn.Parameter)


def _has_tensor(node: torch.fx.Node) -> bool:
    """The node makes tensors of static shape (a SymInt dim would depend on the input)."""
    val = node.meta.get("val")
    tensors = [
        v for v in (val if isinstance(val, (list, tuple)) else [val]) if isinstance(v, torch.Tensor)
    ]
    return bool(tensors) and all(isinstance(d, int) for t in tensors for d in t.shape)


def _evaluate(gm, const: set) -> dict | None:
    """Run the constant nodes in graph order on real tensors; None if any read is stale."""
    values: dict[torch.fx.Node, object] = {}

    def arg(a):
        if not isinstance(a, torch.fx.Node):
            return a
        if a in values:
            return values[a]
        if a.op == "get_attr":
            return operator.attrgetter(a.target)(gm)
        return torch.empty(0, dtype=a.meta["val"].dtype)  # dtype source of a new_* op

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    last_write: dict[int, int] = {}  # storage -> position of the last in-place write to it
    for node in gm.graph.nodes:
        if node not in const:
            continue
        args = torch.fx.node.map_aggregate(node.args, arg)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, arg)
        values[node] = node.target(*args, **kwargs)
        if functional_variant(node) is not None:
            last_write[_storage(values[node])] = order[node]
    for n in const:
        written = last_write.get(_storage(values[n]), -1)
        if any(order[u] < written for u in n.users if u not in const):
            return None
    return values


def _storage(value) -> int:
    return value.untyped_storage().data_ptr() if isinstance(value, torch.Tensor) else -1
