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
    def __init__(self, gm: torch.fx.GraphModule, replace: dict[str, torch.Tensor], keep: bool):
        super().__init__(gm)
        self.values: dict[str, torch.Tensor] = {}
        self.replace = replace
        self.keep = keep

    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        lid = self._layer_of(n)
        if lid is None or not isinstance(result, torch.Tensor):
            return result  # a multi-output op (split, chunk): its getitems are captured
        if self.keep:
            self.values[lid] = result
        if lid in self.replace and self._last(n):
            result = self.replace[lid].to(result.dtype)
        return result

    def _last(self, n: torch.fx.Node) -> bool:
        """Whether ``n`` is the final value of its layer (no output quantizer follows)."""
        return not any(
            u.op == "call_module" and isinstance(self.module.get_submodule(u.target), QFakeQuantize)
            for u in n.users
        )

    def _layer_of(self, n: torch.fx.Node) -> str | None:
        """The layer id whose captured value ``n`` produces, if any (see module docstring)."""
        if ID_KEY in n.meta and n.op in ("call_function", "call_module"):
            return n.meta[ID_KEY]
        if n.op == "call_module" and isinstance(self.module.get_submodule(n.target), QFakeQuantize):
            src = n.args[0]
            if isinstance(src, torch.fx.Node) and ID_KEY in src.meta:
                return src.meta[ID_KEY]  # after the output quantizer
            if isinstance(src, torch.fx.Node) and src.op == "placeholder":
                return f"input:{src.name}"  # the quantized model input
        return None


@torch.no_grad()
def capture(
    gm: torch.fx.GraphModule,
    x: torch.Tensor | tuple[torch.Tensor, ...],
    replace: dict[str, torch.Tensor] | None = None,
    keep: bool = True,
) -> tuple[object, dict[str, torch.Tensor]]:
    """(model output, {layer id: tensor}) for one batch.

    ``replace`` (layer id -> tensor) substitutes those layers' final values as the model
    runs, so everything downstream sees them (sensitivity analysis), while the captured
    value of a replaced layer is what it computed from its (substituted) inputs. ``x``: a
    tuple for a model with several inputs. ``keep=False``: the output only (nothing
    captured, so each value is freed after its last use)."""
    interp = _Capture(gm, replace or {}, keep)
    out = interp.run(*(x if isinstance(x, tuple) else (x,)))
    return out, interp.values
