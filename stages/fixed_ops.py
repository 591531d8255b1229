"""Fixed-point replacements of table ops, inserted into the QAT graph by pre_export.

A :class:`FixedPointOp` takes a float input that already lies on its quantization grid
(``x = q * in_scale``), recovers the integers exactly, evaluates the BPU's integer
algorithm and returns ``out_q * out_scale``. It holds exactly what the exported ONNX custom
op of the ``qparity`` domain holds (attributes + initializers) and evaluates through the
same ``simulator.arith.custom_ops`` evaluator, so the torch qat.export model and qat.onnx compute
the same integers from the same tables: one implementation.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from simulator.arith import fixedpoint
from simulator.arith.custom_ops import CUSTOM_OPS

NP_DTYPES = {"int8": np.int8, "int16": np.int16}


class FixedPointOp(nn.Module):
    """One table op (``onnx_op`` in Lut, Softmax, LayerNorm) of layer ``layer_id``."""

    def __init__(
        self,
        layer_id: str,
        onnx_op: str,
        attrs: dict,
        initializers: dict[str, np.ndarray],
        in_scale: float,
        in_dtype: str,
        out_scale: float,
        out_dtype: str,
    ):
        super().__init__()
        self.layer_id, self.onnx_op = layer_id, onnx_op
        self.attrs, self.initializers = dict(attrs), dict(initializers)
        self.in_scale, self.in_dtype = float(in_scale), in_dtype
        self.out_scale, self.out_dtype = float(out_scale), out_dtype

    def encode(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(ONNX attributes, initializers in input order) of the custom op."""
        return self.attrs, self.initializers

    def int_forward(self, q: np.ndarray) -> np.ndarray:
        """The custom op on integers: ``CUSTOM_OPS[onnx_op].evaluate([q, *tables], attrs)``."""
        inputs = [q.astype(NP_DTYPES[self.in_dtype]), *self.initializers.values()]
        return np.asarray(CUSTOM_OPS[self.onnx_op].evaluate(inputs, self.attrs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``out = F_int(round(x / in_scale)) * out_scale`` (x is on its grid: exact)."""
        q = fixedpoint.quantize(x.detach().cpu().numpy(), self.in_scale, self.in_dtype, "half_even")
        out = torch.from_numpy(self.int_forward(q).astype(np.float32))
        return out * self.out_scale

    def extra_repr(self) -> str:
        return (
            f"{self.onnx_op} {self.layer_id}: {self.in_dtype}@{self.in_scale:.4g} -> "
            f"{self.out_dtype}@{self.out_scale:.4g}"
        )
