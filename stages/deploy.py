"""The deploy graph: the float model traced in eval mode, carrying the QAT model's state.

qat.pt is the graph QAT trains (traced in train mode); export starts from the graph the
board will run (traced in eval mode). Weights and quantizer states move from one to the
other by canonical layer id, never by position, so a train-only branch is reported as
unmapped instead of silently shifting parameters, and a deploy-only layer without trained
state is an error.
"""

from __future__ import annotations

import copy

import torch
import torch.fx

from schemas.errors import StageError
from stages.fake_quant import QFakeQuantize
from stages.layers import ID_KEY
from stages.modelio import attr_tensor, name_quantizers, prepare_qat
from stages.quantizer import QuantPolicy

HINT = "make the eval-mode forward use only layers that exist in training mode"


def deploy_graph(
    float_model: torch.nn.Module,
    example: torch.Tensor,
    policy: QuantPolicy,
    qat_gm: torch.fx.GraphModule,
) -> tuple[torch.fx.GraphModule, dict[str, str]]:
    """(eval-mode graph with the QAT state, {layer id: reason} of QAT layers not in it)."""
    deploy, _, roles = prepare_qat(copy.deepcopy(float_model), example, policy, mode="eval")
    _copy_quantizers(qat_gm, deploy, roles)
    _copy_params(qat_gm, deploy)
    ids = {n.meta[ID_KEY] for n in deploy.graph.nodes if ID_KEY in n.meta}
    missing = {
        n.meta[ID_KEY]: "train-only branch: absent from the eval-mode (deploy) graph"
        for n in qat_gm.graph.nodes
        if ID_KEY in n.meta and n.meta[ID_KEY] not in ids
    }
    return deploy, missing


def _copy_quantizers(src: torch.fx.GraphModule, dst: torch.fx.GraphModule, roles) -> None:
    by_key = {key: name for name, key in name_quantizers(src).items()}
    for name, key in roles.items():
        if key not in by_key:
            raise StageError(
                f"quantizer {key[0]}[{key[1]}] exists only in the deploy graph, "
                "so it was never calibrated",
                where="export",
                hint=HINT,
            )
        fq: QFakeQuantize = dst.get_submodule(name)
        fq.load_state_dict(src.get_submodule(by_key[key]).state_dict())


def param_slots(gm: torch.fx.GraphModule) -> dict[tuple[str, int], str]:
    """(layer id, argument index) -> attribute name of every constant a layer consumes."""
    slots = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or ID_KEY not in node.meta:
            continue
        for i, arg in enumerate(node.args):
            while isinstance(arg, torch.fx.Node) and arg.op == "call_module":
                arg = arg.args[0]  # through the weight quantizer
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                slots[(node.meta[ID_KEY], i)] = arg.target
    return slots


def _copy_params(src: torch.fx.GraphModule, dst: torch.fx.GraphModule) -> None:
    src_slots = param_slots(src)
    with torch.no_grad():
        for key, target in param_slots(dst).items():
            if key not in src_slots:
                raise StageError(
                    f"layer {key[0]} (argument {key[1]}) exists only in the "
                    "deploy graph, so it has no trained weights",
                    where="export",
                    hint=HINT,
                )
            a, b = attr_tensor(dst, target), attr_tensor(src, src_slots[key])
            if a.shape != b.shape:
                raise StageError(
                    f"layer {key[0]}: deploy weight {tuple(a.shape)} vs QAT {tuple(b.shape)}",
                    where="export",
                    hint=HINT,
                )
            a.copy_(b)
