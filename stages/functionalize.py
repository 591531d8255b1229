"""Graphs as users write them: in-place ops out of place, training-only randomness removed.

torch.export keeps a model's in-place ops in its training IR (``nn.ReLU(inplace=True)`` is
``aten.relu_``, ``out += identity`` is ``aten.add_.Tensor``) and, in a train-mode trace, its
training-only randomness (stochastic depth: ``empty -> bernoulli_ -> div_ -> mul``). Both
passes run on the exported graph before canonical ids are assigned, so every later stage
sees one functional, deterministic graph:

- :func:`remove_training_noise`: a value computed only from random sources (``bernoulli``,
  ``rand``, ``empty``...) is *noise*; ``x * noise`` and ``x / noise`` become ``x``. This is
  the deploy behaviour (the noise has mean 1: stochastic depth and dropout scale by the
  keep probability), which makes the QAT model's evaluation deterministic. What was removed
  is returned, and prepare lists it in model_check_result.txt.
- :func:`unbind_to_select`: ``q, k, v = qkv.unbind(0)`` (timm's attention) becomes three
  ``select`` ops, which every stage already carries.
- :func:`out_of_place`: ``aten.op_(x, ...)`` becomes ``aten.op(x, ...)`` and every later use
  of ``x`` reads the new value. An in-place op on a view whose base is read afterwards would
  change meaning, so it is refused with the layer and op named.
"""

from __future__ import annotations

import copy
import operator

import torch
import torch.fx

from schemas.errors import StageError

aten = torch.ops.aten
TRAINING_ONLY_KEY = "qparity_training_only"  # gm.meta: what remove_training_noise removed

# Ops whose value is random (or uninitialized memory that only randomness fills).
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "bernoulli_",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "uniform_",
        "normal_",
        "exponential_",
        "empty",
        "empty_like",
        "new_empty",
        "native_dropout",
    }
)
# How a noise operand is dropped: x * noise, noise * x, x / noise -> x (noise of mean 1).
_SCALED_BY_NOISE = frozenset({"mul", "mul_", "div", "div_"})


def _opname(node: torch.fx.Node) -> str:
    return getattr(node.target, "_opname", "") if node.op == "call_function" else ""


def _where(node: torch.fx.Node) -> str:
    """The module path that called ``node`` (for messages), else the node name."""
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    return f"{path} ({node.name})" if path else node.name


def remove_training_noise(gm: torch.fx.GraphModule) -> list[str]:
    """Drop training-only randomness from ``gm`` in place; returns what was removed."""
    noise = _noise_nodes(gm.graph)
    if not noise:
        return []
    removed = []
    for node in list(gm.graph.nodes):
        if node in noise or node.op != "call_function":
            continue
        operands = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if not any(a in noise for a in operands):
            continue
        kept = [a for a in operands if a not in noise]
        divides_noise = _opname(node).startswith("div") and node.args[0] in noise
        if _opname(node) not in _SCALED_BY_NOISE or len(kept) != 1 or divides_noise:
            raise StageError(
                f"{node.target} at {_where(node)} uses training-only random values "
                "in a way qparity cannot remove (only x * noise and x / noise)",
                where="prepare",
                hint="guard the randomness with `if self.training:` returning the input "
                "unchanged otherwise, or disable it for deployment",
            )
        node.replace_all_uses_with(kept[0])
        removed.append(f"{_where(node)}: {node.target} by random values (identity)")
        gm.graph.erase_node(node)
    erase_unused(gm, noise)
    return removed


def erase_unused(gm: torch.fx.GraphModule, nodes: set[torch.fx.Node]) -> None:
    """Erase those of ``nodes`` nothing reads any more (last first), then recompile."""
    for node in reversed(list(gm.graph.nodes)):
        if node in nodes and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()


def _noise_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Random sources and every value computed only from them (and constants)."""
    noise: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        inputs = [a for a in node.all_input_nodes if a.op != "get_attr"]
        if _opname(node) in RANDOM_OPS or (inputs and all(a in noise for a in inputs)):
            noise.add(node)
    return noise


def functional_variant(node: torch.fx.Node):
    """The out-of-place overload of an in-place aten node, else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    args = target._schema.arguments
    alias = args[0].alias_info if args else None
    if alias is None or not alias.is_write or target._schema.name.endswith("out"):
        return None
    packet = getattr(aten, target._opname.removesuffix("_"), None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def out_of_place(gm: torch.fx.GraphModule) -> int:
    """Rewrite every in-place op of ``gm`` to its functional form; returns how many."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    count = 0
    for node in list(gm.graph.nodes):
        fn = functional_variant(node)
        mutated = node.args[0] if node.args else None
        if fn is None or not isinstance(mutated, torch.fx.Node) or mutated.op == "get_attr":
            continue
        _refuse_view_mutation(node, mutated, order)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(fn, node.args, node.kwargs)
        new.meta = copy.copy(node.meta)
        order[new] = order[node]
        node.replace_all_uses_with(new)
        for user in list(mutated.users):
            if user is not new and order.get(user, -1) > order[node]:
                user.replace_input_with(mutated, new)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count


def _refuse_view_mutation(node, mutated, order) -> None:
    """An in-place write into a view changes its base: refuse when the base is read later."""
    base = mutated
    while _is_view(base):
        base = base.args[0]
        later = [u for u in base.users if order.get(u, -1) > order[node]]
        if later:
            raise StageError(
                f"{node.target} at {_where(node)} writes in place into a view of "
                f"{base.name}, which {later[0].name} reads afterwards",
                where="prepare",
                hint="write that op out of place (e.g. y = torch.relu(x[:, :c]) and "
                "torch.cat to rebuild the tensor)",
            )


def _is_view(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], torch.fx.Node) and _is_view(node.args[0])
    return bool(getattr(node.target, "is_view", False))


def unbind_to_select(gm: torch.fx.GraphModule) -> int:
    """``getitem(unbind(x, d), i)`` -> ``select(x, d, i)``; returns how many unbinds went."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.unbind.int:
            continue
        x, dim = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise StageError(
                    f"the outputs of unbind at {_where(node)} are used as a list",
                    where="prepare",
                    hint="index the result (a, b = x.unbind(0)) or use torch.select",
                )
            with gm.graph.inserting_before(user):
                sel = gm.graph.call_function(aten.select.int, (x, dim, user.args[1]))
            sel.meta = dict(node.meta, val=user.meta.get("val"))
            user.replace_all_uses_with(sel)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count


def rsub_to_add(gm: torch.fx.GraphModule) -> int:
    """``rsub(x, c, alpha)`` (``c - alpha * x``, what ``1 - mask`` traces to) ->
    ``add(mul(x, -alpha), c)``: ops the chain has; returns how many were rewritten."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.rsub.Scalar:
            continue
        x, c = node.args[:2]
        alpha = node.args[2] if len(node.args) > 2 else node.kwargs.get("alpha", 1)
        with gm.graph.inserting_before(node):
            neg = gm.graph.call_function(aten.mul.Tensor, (x, -alpha))
            add = gm.graph.call_function(aten.add.Tensor, (neg, c))
        neg.meta = dict(node.meta)
        add.meta = dict(node.meta)
        node.replace_all_uses_with(add)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count
