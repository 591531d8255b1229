"""Export the trained digits CNN (examples/digits/model.py) to an ONNX float model.

The TorchScript exporter (``dynamo=False``) keeps module scopes in node names
(``/block1/conv1/Conv``), which the PTQ chain turns into layer ids (``block1.conv1``);
constant folding is off so that batch norms stay in the file and the optimized stage's BN
fusion has work to do, as with a model straight out of training code.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from examples.digits.model import build


def export_onnx(path: str | Path) -> Path:
    """Write the digits CNN to ``path`` (opset 17, dynamic batch); returns the path."""
    return torchscript_export(build(), torch.zeros(1, 1, 8, 8), path)


def torchscript_export(model: torch.nn.Module, example: torch.Tensor, path: str | Path) -> Path:
    """``model`` as ONNX by torch's TorchScript exporter: opset 17, input ``x``, output
    ``logits``, dynamic batch, constant folding off (batch norms stay); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=False,
            input_names=["x"],
            output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
            do_constant_folding=False,
        )
    return path


def dynamo_export(
    model: torch.nn.Module, example: torch.Tensor, path: str | Path, dynamic: bool = True
) -> Path:
    """``model`` as ONNX by torch's dynamo exporter (``torch.onnx.export(dynamo=True)``,
    onnxscript): opset 18, input ``x``, output ``logits``, dynamic batch (``dynamic=False``:
    the batch of ``example``), the exporter's own graph optimizer on (as users run it: batch
    norms fused into the convs before them); module scopes are in each node's
    ``pkg.torch.onnx.name_scopes``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, (example,), dynamo=True, opset_version=18, input_names=["x"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},) if dynamic else None,
            verbose=False,
        )  # fmt: skip
    program.save(str(path))
    return path
