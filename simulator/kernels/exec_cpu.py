"""CPU islands: the float ONNX ops convert left unconverted, run on the board's CPU side.

A float island is any standard ONNX op (PRelu, MatMul, ReduceSum, Erf...). The few common
ones run in torch (:data:`TORCH_OPS`); every other op runs through onnx's own reference
implementation, the same code that evaluates quantized.onnx, so an island computes on the
board exactly what it computes in the integer graph. compile records the op's ONNX
attributes and, in ``operands``, the order of its inputs (``d``: the next data buffer,
``c``: the next constant, ``-``: an omitted optional input), since an instruction keeps
buffers and constants apart.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

from schemas.errors import SimulatorError

TORCH_OPS = {
    "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Exp": torch.exp, "Relu": torch.relu,
    "Add": torch.add, "Mul": torch.mul, "HardSigmoid": torch.nn.functional.hardsigmoid,
    "HardSwish": torch.nn.functional.hardswish,
}  # fmt: skip
_OWN_ATTRS = frozenset({"op_type", "operands", "opset"})


def cpu_op(instr, bufs, consts) -> list[torch.Tensor]:
    """CPU: the float ONNX op ``attrs["op_type"]`` on its operands, in ONNX input order."""
    op_type = instr.attrs.get("op_type")
    xs = _ordered(instr, bufs, consts)
    if op_type in TORCH_OPS:
        return [TORCH_OPS[op_type](*(x.float() for x in xs))]
    feeds = {f"i{k}": x.numpy() for k, x in enumerate(xs) if x is not None}
    try:
        evaluator = consts.cached(("cpu", instr.outputs), lambda: _evaluator(instr, len(xs)))
        outs = evaluator.run(None, feeds)
    except Exception as e:  # the reference implementation raises many types
        raise SimulatorError(
            f"CPU op {op_type!r} failed: {type(e).__name__}: {e}",
            hint="the island's inputs do not fit the op; check quantized.onnx",
        ) from e
    return [torch.from_numpy(np.ascontiguousarray(o)) for o in outs]


def _ordered(instr, bufs, consts) -> list:
    """The operands in ONNX input order (data and constants interleaved as recorded)."""
    data = iter(bufs[n] for n in instr.inputs)
    const = iter(consts[c] for c in instr.consts)
    order = instr.attrs.get("operands") or "d" * len(instr.inputs) + "c" * len(instr.consts)
    pick = {"d": lambda: next(data), "c": lambda: next(const), "-": lambda: None}
    return [pick[k]() for k in order]


def _evaluator(instr, n_inputs: int) -> ReferenceEvaluator:
    attrs = {k: v for k, v in instr.attrs.items() if k not in _OWN_ATTRS}
    names = [f"i{k}" for k in range(n_inputs)]
    order = instr.attrs.get("operands") or "d" * n_inputs
    inputs = [n if k != "-" else "" for n, k in zip(names, order, strict=True)]
    outputs = [f"o{k}" for k in range(len(instr.outputs))]
    node = helper.make_node(instr.attrs["op_type"], inputs, outputs, **attrs)
    graph = helper.make_graph(
        [node],
        "island",
        [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in inputs if n],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outputs],
    )
    opset = int(instr.attrs.get("opset", 21))
    return ReferenceEvaluator(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    )
