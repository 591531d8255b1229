"""The modelled Nash BPU's instruction set and program: the contract of .hbm, compile and
the executor.

Machine state: a set of named integer buffers (activations, NHWC with the channel axis
padded to the march's alignment, or plain N-D for non-image tensors) and a constant pool
(packed weights, biases, multipliers, shifts, tables). A program is a straight-line list of
instructions over that state; each instruction reads named buffers and constants and writes
named buffers, and records every canonical layer id it covers (many-to-one after fusion).

Semantics of each op are those of the quantized.onnx op it comes from (simulator.arith.int_ops,
simulator.arith.lut, simulator.arith.composite); ``Op`` only adds the board's data movement and layout.
Which quantized.onnx op compiles to which instruction, and every kernel of each, is the
instruction table :data:`simulator.instructions.INSTRUCTIONS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

HBM_VERSION = 1


class Op(StrEnum):
    """The closed instruction set."""

    QUANTIZE = "quantize"  # float featuremap input -> int (scale, dtype, rounding)
    PREPROCESS = "preprocess"  # board camera input (nv12/yuv444/rgb...) -> int8 featuremap
    CONV = "conv"  # QConv (+ fused relu or clip; two inputs: + fused QAdd, see exec_conv)
    LINEAR = "linear"  # QLinear (two inputs: + fused QAdd, see exec_ops.k_linear)
    MATMUL = "matmul"  # QMatMul
    ADD = "add"  # QAdd (scale-aligned, + fused relu)
    MUL = "mul"  # QMul
    REQUANT = "requant"  # QRequant
    AVGPOOL = "avgpool"  # QAvgPool
    REDUCE_MEAN = "reduce_mean"  # QReduceMean
    REDUCE_SUM = "reduce_sum"  # QReduceSum
    MAXPOOL = "maxpool"  # QMaxPool
    CLIP = "clip"  # QClip
    LUT = "lut"  # Lut
    SOFTMAX = "softmax"  # Softmax (int16 inside)
    LAYERNORM = "layernorm"  # LayerNorm (int16 inside)
    LAYOUT = "layout"  # data movement: ONNX op_type in attrs (Reshape, Transpose, ...)
    DEQUANTIZE = "dequantize"  # int output -> float (scale, axis)
    CPU = "cpu"  # a float island: dequantize, the float op (ONNX), quantize, on the CPU


COMPUTE = frozenset(
    {
        Op.CONV,
        Op.LINEAR,
        Op.MATMUL,
        Op.ADD,
        Op.MUL,
        Op.REQUANT,
        Op.AVGPOOL,
        Op.REDUCE_MEAN,
        Op.REDUCE_SUM,
    }
)
TABLE = frozenset({Op.LUT, Op.SOFTMAX, Op.LAYERNORM})
DATA = frozenset({Op.MAXPOOL, Op.CLIP, Op.LAYOUT})
IO = frozenset({Op.QUANTIZE, Op.PREPROCESS, Op.DEQUANTIZE, Op.CPU})
if frozenset(Op) != COMPUTE | TABLE | DATA | IO:  # the categories partition the set
    raise AssertionError("every instruction belongs to exactly one category")


@dataclass(frozen=True)
class Layout:
    """How a buffer is stored: ``"nhwc"`` (channels last, padded to ``channels_padded``)
    or ``"plain"`` (the reference layout); ``channels`` is the real channel count."""

    kind: str = "plain"
    channels: int = 0
    channels_padded: int = 0


@dataclass(frozen=True)
class Instruction:
    """One instruction: reads ``inputs`` (buffers) and ``consts`` (constant pool names),
    writes ``outputs``; ``attrs`` are JSON-able; ``layer_ids`` the canonical ids covered."""

    op: Op
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    consts: tuple[str, ...] = ()
    attrs: dict = field(default_factory=dict)
    layer_ids: tuple[str, ...] = ()


@dataclass
class Program:
    """A compiled model: I/O, instructions, constants, buffer layouts, and the march."""

    march: str
    inputs: dict[str, dict]  # name -> {"shape": [...], "dtype": "float32"|..., "format": ...}
    outputs: dict[str, dict]  # name -> {"dtype": ..., ...}
    instructions: list[Instruction]
    constants: dict[str, np.ndarray]
    layouts: dict[str, Layout] = field(default_factory=dict)  # buffer -> layout
    captures: dict[str, str] = field(default_factory=dict)  # layer id -> buffer holding it
    version: int = HBM_VERSION
