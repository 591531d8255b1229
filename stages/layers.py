"""The op table and canonical layer ids of an exported (torch.export) graph.

Every op qparity can carry through the chain is an entry of the op table
(:mod:`stages.ops`); :data:`OP_TABLE` is its aten target -> (op, category) view. Anything else is *unsupported* and is reported by name and node
before any stage runs (docs/design.md, "Op coverage").

Canonical layer id (docs/design.md, "Contracts"): the module path of the float model.
- A node that is the only op of a leaf module call gets the module path (``block1.conv1``);
  a second call of the same module gets ``@k`` (``relu@1``), as torch.export names it.
- Any other node gets ``<module path>.<op>`` (``block1.add``, ``att.linear_1``) with the
  op numbered in graph order inside that module when it repeats; the root module's own
  ops are just ``<op>``.
The id is computed once on the exported float graph and stored in ``node.meta[ID_KEY]``;
prepare keeps node meta, so every later torch-side model sees the same ids.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import torch
import torch.fx

from stages.ops import Category, op_table

ID_KEY = "qparity_id"

OP_TABLE = op_table()
"""aten target -> (op name, category): the view of the op table :mod:`stages.ops`."""


@dataclass(frozen=True)
class OpInfo:
    """One tensor-producing node of an exported graph."""

    node: str
    layer_id: str
    op_type: str
    category: Category | None  # None: unsupported
    target: str
    module_type: str
    inputs: tuple[str, ...] = ()  # node names of the tensor inputs
    source: str = ""  # the user's source line that made the op ("file:line (code)")

    @property
    def supported(self) -> bool:
        return self.category is not None


def is_tensor_node(node: torch.fx.Node) -> bool:
    """True for call_function nodes that produce a tensor (not SymInt shape arithmetic)."""
    if node.op != "call_function":
        return False
    if _is_buffer_update(node):
        return False
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in val)
    return isinstance(val, torch.Tensor)


def _is_buffer_update(node: torch.fx.Node) -> bool:
    """In-place update of a buffer (BN's num_batches_tracked += 1 in a train-mode trace)."""
    name = getattr(node.target, "_opname", "")
    first = node.args[0] if node.args else None
    return name.endswith("_") and isinstance(first, torch.fx.Node) and first.op == "get_attr"


def classify(node: torch.fx.Node) -> tuple[str, Category | None]:
    """(op_type, category) of a node; an unknown target gives (target name, None)."""
    found = OP_TABLE.get(node.target)
    if found is not None:
        return found
    return getattr(node.target, "_opname", str(node.target)), None


def _module_of(node: torch.fx.Node) -> tuple[str, str, str]:
    """(stack key, module path, module type) of the innermost module that called ``node``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", "", ""
    key, (path, mtype) = list(stack.items())[-1]
    mtype = mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", str(mtype))
    if key.startswith("_empty_nn_module_stack"):
        return "", "", ""
    return key, path, mtype


def assign_layer_ids(gm: torch.fx.GraphModule) -> list[OpInfo]:
    """Give every tensor node of ``gm`` its canonical id (in ``node.meta[ID_KEY]``)."""
    nodes = [n for n in gm.graph.nodes if is_tensor_node(n)]
    per_call = defaultdict(list)
    for n in nodes:
        per_call[_module_of(n)[0]].append(n)
    op_counts: Counter[tuple[str, str]] = Counter()
    infos = []
    for n in nodes:
        key, path, mtype = _module_of(n)
        op_type, cat = classify(n)
        call = key.rsplit("@", 1)[1] if "@" in key else None
        owned = path and len(per_call[key]) == 1
        if owned:
            layer_id = f"{path}@{call}" if call else path
        else:
            base = f"{path}.{op_type}" if path else op_type
            k = op_counts[(key, op_type)]
            op_counts[(key, op_type)] += 1
            layer_id = base if k == 0 else f"{base}_{k}"
            if call:
                layer_id = f"{layer_id}@{call}"
        n.meta[ID_KEY] = layer_id
        infos.append(
            OpInfo(
                n.name,
                layer_id,
                op_type,
                cat,
                str(n.target),
                mtype,
                tuple(a.name for a in n.all_input_nodes),
                source_line(n),
            )
        )
    return infos


def source_line(node: torch.fx.Node) -> str:
    """``file:line (code)`` of the innermost frame of the node's stack trace, else ""."""
    lines = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("File ")]
    if not frames:
        return ""
    head = lines[frames[-1]].strip()
    code = lines[frames[-1] + 1].strip() if frames[-1] + 1 < len(lines) else ""
    where = head.removeprefix("File ").replace('"', "").split(", in ")[0].replace(", line ", ":")
    return f"{where} ({code})" if code else where


def layer_infos(gm: torch.fx.GraphModule) -> list[OpInfo]:
    """The ops of a graph whose ids were assigned earlier (e.g. after prepare)."""
    out = []
    for n in gm.graph.nodes:
        if ID_KEY in n.meta and n.op == "call_function":
            op_type, cat = classify(n)
            out.append(
                OpInfo(n.name, n.meta[ID_KEY], op_type, cat, str(n.target), _module_of(n)[2])
            )
    return out


def module_call_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Module path -> number of distinct calls, for modules called more than once."""
    calls: dict[str, set[str]] = defaultdict(set)
    for n in gm.graph.nodes:
        if is_tensor_node(n):
            key, path, _ = _module_of(n)
            if path:
                calls[path].add(key)
    return {p: len(keys) for p, keys in calls.items() if len(keys) > 1}
