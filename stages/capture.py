"""Run a torch-side stage model on a batch and capture every layer's tensor by canonical id.

A layer's captured value is what its consumers see: the output of its output quantizer
when it has one, else its own output. The quantized model input is captured as
``input:<name>``. qat.onnx names the same tensor after the layer id,
so both sides capture the same thing.
"""

from __future__ import annotations

import torch
import torch.fx

from stages.fake_quant import QFakeQuantize
from stages.layers import ID_KEY


class _Capture(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.values: dict[str, torch.Tensor] = {}

    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        if ID_KEY in n.meta and n.op in ("call_function", "call_module"):
            self.values[n.meta[ID_KEY]] = result
        elif n.op == "call_module" and isinstance(
            self.module.get_submodule(n.target), QFakeQuantize
        ):
            src = n.args[0]
            if isinstance(src, torch.fx.Node) and ID_KEY in src.meta:
                self.values[src.meta[ID_KEY]] = result  # after the output quantizer
            elif isinstance(src, torch.fx.Node) and src.op == "placeholder":
                self.values[f"input:{src.name}"] = result  # the quantized model input
        return result


@torch.no_grad()
def capture(gm: torch.fx.GraphModule, x: torch.Tensor) -> tuple[object, dict[str, torch.Tensor]]:
    """(model output, {layer id: tensor}) for one batch."""
    interp = _Capture(gm)
    out = interp.run(x)
    return out, interp.values
