"""qat (optional): N fine-tuning steps of the calibrated QAT model, then scales frozen.

During training every quantizer is in QAT state (observer on, fake quant on, straight-
through gradients) and the exported graph is switched to train mode with torchao's helper
(``.train()`` on an exported model raises); afterwards eval mode and VALIDATION state.
The loss is cross-entropy against the labels, or, for a dataset without labels, the mean
squared distance to the float model's outputs.
"""

from __future__ import annotations

import numpy as np
import torch

from schemas.artifacts import QatModelArtifact, QatTunedModel
from stages.calibrate import save_qat
from stages.context import RunContext
from stages.evaluate import stage_metrics
from stages.fake_quant import QuantState, freeze_model, set_model_state
from stages.modelio import load_qat
from stages.modes import to_eval, to_train
from stages.outputs import flat_outputs, judged_output
from stages.registry_types import StageCall


def qat(upstream: QatModelArtifact, ctx: RunContext, call: StageCall) -> QatTunedModel:
    """Fine-tune for ``stages.qat.steps`` steps on the train split; evaluate."""
    cfg = ctx.spec.stages.qat
    gm = load_qat(upstream, ctx)
    train = ctx.splits["train"]
    for _ in train.batches(len(train)):  # refuse NaN/Inf (naming the sample) before training
        pass
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    set_model_state(gm, QuantState.QAT)
    to_train(gm)
    opt = torch.optim.Adam([p for p in gm.parameters() if p.requires_grad], lr=cfg.lr)
    for _ in range(cfg.steps):
        idx = rng.choice(len(train), size=min(cfg.batch_size, len(train)), replace=False)
        loss = _loss(ctx, flat_outputs(gm(*_inputs(train, idx))), train, idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
    to_eval(gm)
    freeze_model(gm)
    set_model_state(gm, QuantState.VALIDATION)
    return save_qat(gm, ctx, call, QatTunedModel, upstream, stage_metrics(ctx, "qat", gm))


def _loss(ctx: RunContext, outs: dict[str, torch.Tensor], train, idx: np.ndarray) -> torch.Tensor:
    """Cross-entropy of the judged output against the labels; without labels, the mean
    squared distance to the float model's outputs, summed over outputs (fine-tuning towards
    agreement, as the metrics judge it)."""
    if train.labels is not None:
        out = outs[judged_output(outs, ctx.spec.compare.output, True)]
        return torch.nn.functional.cross_entropy(out, torch.from_numpy(train.labels[idx]))
    with torch.no_grad():
        target = flat_outputs(ctx.float_model(*_inputs(train, idx)))
    return sum(torch.nn.functional.mse_loss(outs[k], target[k]) for k in target)


def _inputs(split, idx: np.ndarray) -> tuple[torch.Tensor, ...]:
    """The samples ``idx`` of every input of ``split``, in the model's parameter order."""
    return tuple(torch.from_numpy(a[idx]) for a in split.inputs.values())
