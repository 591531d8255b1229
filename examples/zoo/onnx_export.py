"""The zoo's models as ONNX float files, for the PTQ chain (``qparity ptq``).

A PTQ spec names ``examples.zoo.onnx_export:<name>`` (or ``small_<name>``) as its
``model.export``: called with the spec's ``model.file``, it builds the zoo model as
:mod:`examples.zoo.models` does and writes it with torch's TorchScript exporter
(``dynamo=False``: module scopes in node names, so layer ids match the QAT chain's where
the exporter kept them), opset 17, a dynamic batch, input ``x``, output ``logits``,
constant folding off (batch norms stay for the optimized stage to fuse).
``dynamo_<name>`` writes the same model with torch's dynamo exporter instead
(:func:`examples.digits_ptq.export.dynamo_export`), from a batch-1 example as users export;
when torch.export refuses the dynamic batch (convnext: the batch-1 example specializes it,
"Invalid ranges [2:1]"), the file is written with the batch fixed at 1, which the PTQ
chain's ``original`` makes dynamic again (stages/ptq/generalize.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from examples.digits_ptq.export import dynamo_export, torchscript_export
from examples.zoo.models import build, entry_of

DYNAMO = "dynamo_"


def export(attr: str, path: str | Path) -> Path:
    """Write zoo model ``attr`` (``resnet18``, ``small_resnet18``, ``dynamo_resnet18``) to
    ``path``."""
    dynamo = attr.startswith(DYNAMO)
    entry, size = entry_of(attr.removeprefix(DYNAMO))
    model, example = build(entry.name, size), torch.zeros(1, 3, size, size)
    if not dynamo:
        return torchscript_export(model, example, path)
    try:
        return dynamo_export(model, example, path)
    except torch.onnx.OnnxExporterError:  # torch.export refused the dynamic batch
        return dynamo_export(model, example, path, dynamic=False)


def __getattr__(attr: str):
    """``examples.zoo.onnx_export:<name>`` as a PTQ spec's ``model.export``."""
    if attr.startswith("__"):
        raise AttributeError(attr)
    entry_of(attr.removeprefix(DYNAMO))  # an unknown name fails here, naming the zoo
    return lambda path: export(attr, path)
