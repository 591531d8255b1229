"""Train and eval mode of an exported QAT graph: torchao's dropout / batch-norm rewrites,
run only where the graph can hold what they rewrite.

``torch.export`` fixes dropout and batch norm into the graph in the mode it traced, so
torchao's ``move_exported_model_to_eval`` / ``_to_train`` swap their aten patterns. Each
call exports (strict, through dynamo) its six pattern graphs whatever the graph holds:
2.2 s a call on a 2-core machine, measured as half of a tiny model's whole chain (prepare
and export each call it once). A graph without a dropout op cannot match a dropout
pattern (nor one without batch norm a batch-norm pattern), so that rewrite is skipped;
where the op is present, torchao's own rewrite runs. Either way the graph ends as torchao
leaves it: dead code removed, recompiled, marked with torchao's mode attribute.
"""

from __future__ import annotations

import torch.fx
from torchao.quantization.pt2e import export_utils

REWRITES = (("dropout", export_utils._replace_dropout),
            ("batch_norm", export_utils._replace_batchnorm))  # fmt: skip
"""(what the op's aten name holds, torchao's rewrite of its pattern), in torchao's order."""


def holds(gm: torch.fx.GraphModule, name: str) -> bool:
    """Whether a call in ``gm`` targets an op whose name contains ``name``."""
    return any(n.op == "call_function" and name in str(n.target) for n in gm.graph.nodes)


def set_mode(gm: torch.fx.GraphModule, train: bool) -> torch.fx.GraphModule:
    """``move_exported_model_to_train(gm)`` (train) or ``_to_eval(gm)``, same graph after.

    torchao's marker: a graph never marked counts as training for the move to eval and as
    eval for the move to train, so each move runs once on a fresh graph."""
    if getattr(gm, export_utils._EXPORTED_TRAINING_ATTR, not train) == train:
        return gm
    setattr(gm, export_utils._EXPORTED_TRAINING_ATTR, train)
    for name, rewrite in REWRITES:
        if holds(gm, name):
            rewrite(gm, train_to_eval=not train)
        else:  # what the rewrite does before matching, so the graph ends the same
            gm.graph.eliminate_dead_code()
            gm.recompile()
    return gm


def to_eval(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The exported graph in eval mode (dropout off, batch norm on running statistics)."""
    return set_mode(gm, train=False)


def to_train(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The exported graph in train mode (dropout on, batch norm on batch statistics)."""
    return set_mode(gm, train=True)
