"""The instruction table: every :class:`~simulator.program.isa.Op` with everything the simulator
knows about it, in one entry.

An :class:`Instr` names the quantized.onnx op it is compiled from (domain ``qparity``;
``None`` for the instructions compile makes from standard ONNX nodes), its numpy reference
evaluator (:data:`simulator.arith.custom_ops.CUSTOM_OPS`, the ONNX runner's code), the
executor's whole-tensor torch kernel, the compiled kernels it may call
(:data:`simulator.runtime.native.SIGNATURES` names) and whether compile may give it channels-last
buffers. The executor's ``KERNELS``, compile's ``FROM_ONNX`` and ``NHWC_OPS`` are views of
:data:`INSTRUCTIONS`. The torch-side op table (``stages/ops/``) says which aten ops reach
which instruction; ``qparity ops`` lists both.

Instructions from standard ONNX ops (LAYOUT, DEQUANTIZE, CPU) have the reference
:data:`ONNX_REFERENCE`: onnx's own reference implementation of the op evaluates them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.kernels.exec_cpu import cpu_op
from simulator.kernels.exec_layout import k_layout
from simulator.kernels.exec_ops import k_add, k_clip, k_conv, k_linear, k_matmul, k_mul, k_requant
from simulator.kernels.exec_pool import k_avgpool, k_maxpool, k_reduce_mean, k_reduce_sum
from simulator.kernels.exec_table_ops import (
    k_dequantize,
    k_layernorm,
    k_lut,
    k_preprocess,
    k_quantize,
    k_softmax,
)
from simulator.program.isa import Op

ONNX_REFERENCE = "onnx.reference"
"""The reference of an instruction made from a standard ONNX op: onnx's evaluator."""


@dataclass(frozen=True)
class Instr:
    """One instruction: where it comes from and every implementation of it."""

    op: Op
    onnx_op: str | None  # quantized.onnx op type (domain qparity) compiled to this op
    reference: Callable | str  # numpy evaluator ``(inputs, attrs) -> ints``, or ONNX_REFERENCE
    kernel: Callable  # the executor's ``fn(instr, bufs, consts) -> [tensors]``
    native: tuple[str, ...] = ()  # compiled kernels it may call (simulator.runtime.native)
    nhwc: bool = False  # compile may store its 4-D buffers channels-last


def _preprocess(x, attrs):
    """The board input path's numpy reference (imported on use, as the kernel does)."""
    from simulator.arith.board_input import preprocess

    return preprocess(x, attrs)


def _ref(onnx_op: str) -> Callable:
    return CUSTOM_OPS[onnx_op].evaluate


def _int(op: Op, onnx_op: str, kernel: Callable, native=(), nhwc=False) -> Instr:
    """An integer op of quantized.onnx: its reference is the custom op's evaluator."""
    return Instr(op, onnx_op, _ref(onnx_op), kernel, tuple(native), nhwc)


TABLE: tuple[Instr, ...] = (
    Instr(Op.QUANTIZE, None, _ref("QuantizeLinear"), k_quantize,
          ("qp_quantize", "qp_quantize_pad")),  # the second: runtime/fuse.py's
    Instr(Op.PREPROCESS, None, _preprocess, k_preprocess),
    _int(Op.CONV, "QConv", k_conv, ("qp_conv", "qp_conv_amx", "qp_pad", "qp_dwconv"), nhwc=True),
    _int(Op.LINEAR, "QLinear", k_linear, ("qp_conv", "qp_conv_amx", "qp_linear_amx")),
    _int(Op.MATMUL, "QMatMul", k_matmul, ("qp_conv", "qp_bmm", "qp_bmm_strided", "qp_bmm_pairs")),
    _int(Op.ADD, "QAdd", k_add, ("qp_add",), nhwc=True),
    _int(Op.MUL, "QMul", k_mul, ("qp_mul", "qp_mul_cl")),
    _int(Op.REQUANT, "QRequant", k_requant, ("qp_add",), nhwc=True),
    _int(Op.AVGPOOL, "QAvgPool", k_avgpool),
    _int(Op.REDUCE_MEAN, "QReduceMean", k_reduce_mean, ("qp_mean", "qp_mean_cl")),
    _int(Op.REDUCE_SUM, "QReduceSum", k_reduce_sum),
    _int(Op.MAXPOOL, "QMaxPool", k_maxpool, ("qp_maxpool",), nhwc=True),
    _int(Op.CLIP, "QClip", k_clip, ("qp_clip",), nhwc=True),
    _int(Op.LUT, "Lut", k_lut, ("qp_gather",)),
    _int(Op.SOFTMAX, "Softmax", k_softmax, ("qp_softmax",)),
    _int(Op.LAYERNORM, "LayerNorm", k_layernorm, ("qp_layernorm",)),
    Instr(Op.LAYOUT, None, ONNX_REFERENCE, k_layout, ("qp_copy", "qp_to_nhwc")),
    Instr(Op.DEQUANTIZE, None, ONNX_REFERENCE, k_dequantize, ("qp_dequantize",)),
    Instr(Op.CPU, None, ONNX_REFERENCE, cpu_op),
)
INSTRUCTIONS: dict[Op, Instr] = {i.op: i for i in TABLE}
"""Op -> its entry, in :class:`Op` order."""

FROM_ONNX: dict[str, Op] = {i.onnx_op: i.op for i in TABLE if i.onnx_op}
"""quantized.onnx op type (qparity domain) -> instruction (view of :data:`INSTRUCTIONS`)."""

NHWC_OPS: frozenset[Op] = frozenset(i.op for i in TABLE if i.nhwc)
"""The instructions compile may give channels-last buffers."""


def kernels() -> dict[Op, Callable]:
    """A fresh ``Op -> kernel`` table (the executor keeps one as ``KERNELS``)."""
    return {i.op: i.kernel for i in TABLE}
