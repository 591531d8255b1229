"""The vendor-style prepare reports: debug/fx_graph.txt and debug/model_check_result.txt.

model_check_result.txt lists the ops found, the dtype chosen per layer, unsupported ops,
training-only randomness removed (stochastic depth), modules called more than once, and
model outputs that are not high precision.
"""

from __future__ import annotations

from collections import Counter

import torch.fx

from stages.fake_quant import QFakeQuantize
from stages.functionalize import TRAINING_ONLY_KEY
from stages.layers import ID_KEY, OpInfo, module_call_counts


def render_fx_graph(gm: torch.fx.GraphModule) -> str:
    """The graph as numbered lines: index, node, op, target, canonical id, inputs."""
    lines = ["# index | node | op | target | layer_id | inputs"]
    for i, n in enumerate(gm.graph.nodes):
        args = ", ".join(a.name for a in n.all_input_nodes)
        lines.append(
            f"{i:4d} | {n.name} | {n.op} | {n.target} | {n.meta.get(ID_KEY, '-')} | {args}"
        )
    return "\n".join(lines) + "\n"


def quantizer_table(gm: torch.fx.GraphModule, roles: dict[str, tuple[str, str]]) -> list[dict]:
    """One row per quantizer: layer, role, dtype, qscheme, state, scale summary."""
    rows = []
    for name, (layer, role) in sorted(roles.items(), key=lambda kv: kv[1]):
        fq: QFakeQuantize = gm.get_submodule(name)
        rows.append(
            {
                "quantizer": name,
                "layer_id": layer,
                "role": role,
                "dtype": str(fq.dtype).removeprefix("torch."),
                "qscheme": "per_channel" if fq.ch_axis is not None else "per_tensor",
                "pot": bool(fq.pot),
            }
        )
    return rows


def render_check(
    infos: list[OpInfo], gm: torch.fx.GraphModule | None, roles: dict[str, tuple[str, str]] | None
) -> str:
    """model_check_result.txt; ``gm``/``roles`` are None when prepare stopped early."""
    out = ["# model_check_result", "", "## ops found (op_type: count)"]
    for op, k in sorted(Counter(i.op_type for i in infos).items()):
        out.append(f"{op}: {k}")
    unsupported = [i for i in infos if not i.supported]
    out += ["", f"## unsupported ops ({len(unsupported)})"]
    out += [
        f"{i.target} | node {i.node} | layer {i.layer_id} | {i.source or 'source unknown'}"
        for i in unsupported
    ] or ["none"]
    if gm is None:
        return "\n".join(out) + "\n"
    out += ["", "## training-only randomness removed (identity in every stage)"]
    out += list(gm.meta.get(TRAINING_ONLY_KEY, [])) or ["none"]
    out += ["", "## layers merged into another (BN folding)"]
    out += [f"{k}: folded into {v}" for k, v in folded_layers(infos, gm).items()] or ["none"]
    out += ["", "## modules called more than once (each call gets its own quantizers)"]
    repeated = module_call_counts(gm)
    out += [f"{path}: {k} calls" for path, k in sorted(repeated.items())] or ["none"]
    out += ["", "## quantizers: layer_id | role | dtype | qscheme | pot"]
    for r in quantizer_table(gm, roles or {}):
        out.append(f"{r['layer_id']} | {r['role']} | {r['dtype']} | {r['qscheme']} | {r['pot']}")
    out += ["", "## model outputs"]
    out += _output_lines(gm)
    return "\n".join(out) + "\n"


def folded_layers(infos: list[OpInfo], gm: torch.fx.GraphModule) -> dict[str, str]:
    """Layers of the float graph absent after prepare -> the layer they were folded into."""
    kept = {n.meta.get(ID_KEY) for n in gm.graph.nodes}
    by_node = {i.node: i.layer_id for i in infos}
    return {
        i.layer_id: by_node.get(i.inputs[0], "?") if i.inputs else "?"
        for i in infos
        if i.layer_id not in kept
    }


def _output_lines(gm: torch.fx.GraphModule) -> list[str]:
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    lines = []
    for arg in out_node.all_input_nodes:
        if arg.op == "call_module" and isinstance(gm.get_submodule(arg.target), QFakeQuantize):
            src = arg.args[0]
            fq = gm.get_submodule(arg.target)
            lines.append(
                f"{src.meta.get(ID_KEY, src.name)}: NOT high precision "
                f"({str(fq.dtype).removeprefix('torch.')} output); "
                "advice: end the model with a conv/linear so it can output int32"
            )
        else:
            lines.append(f"{arg.meta.get(ID_KEY, arg.name)}: high precision (unquantized)")
    return lines
