"""One op the chain knows: :class:`OpEntry`, and the quantization :class:`Category`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from simulator.program.isa import Op

QDOMAIN = "qparity"  # the custom ONNX domain (stages.onnx_builder.DOMAIN)


class Category(StrEnum):
    """How an op is quantized. Passthrough ops keep their input's scale exactly."""

    WEIGHTED = "weighted"  # conv/linear: int8 per-channel weights, int32 accumulate
    COMPUTE = "compute"  # produces new values: output gets its own quantizer
    LUT = "lut"  # table op on the BPU (sigmoid, exp, ...): output quantizer
    COMPOSITE = "composite"  # decomposed on the BPU (softmax, layer_norm, attention)
    PASSTHROUGH = "passthrough"  # layout/selection ops: exact under the input's scale


@dataclass(frozen=True)
class OpEntry:
    """Everything about one op, from the aten graph to the board.

    - ``targets``: the aten overloads it matches (in-place forms ``aten.op_`` are rewritten
      to these by :func:`stages.functionalize.out_of_place` before anything classifies);
      empty for the quantizers the chain itself inserts.
    - quantizer placement: ``category``; ``activation_inputs`` = how many leading tensor
      inputs are activations (the rest are parameters; None: all);
      ``fuses_accumulator``: a conv/linear whose only user is this op hands it its int32
      accumulator (no output quantizer in between).
    - ``onnx``: the export rule ``rule(b, node)`` (:mod:`stages.onnx_builder`), or
      ``(target, rule)`` pairs when the targets differ (:func:`per_target`); None: export
      refuses the op. ``onnx_ops``: the ONNX op types the rules write (informational).
    - ``convert``: ``(op_type, rule)`` pairs, ``op_type`` being a qat.onnx node type
      (``"qparity.Lut"`` for the custom domain) and ``rule(c, k, node) -> bool`` its
      integer form (:mod:`stages.convert.graph`); absent: the node stays a float island.
    - ``table_op``: the custom ONNX op pre_export writes for a table op (Lut, Softmax...).
    - ``instructions``: what compile makes of its integer form (``Op.CPU``: a float island
      on the board's CPU); the kernels of each are :data:`simulator.instructions.INSTRUCTIONS`.
    """

    name: str
    category: Category | None
    targets: tuple = ()
    onnx: Callable | tuple[tuple[object, Callable], ...] | None = None
    onnx_ops: tuple[str, ...] = ()
    convert: tuple[tuple[str, Callable], ...] = ()
    instructions: tuple[Op, ...] = ()
    table_op: str | None = None
    activation_inputs: int | None = None
    fuses_accumulator: bool = False
    doc: str = ""

    def onnx_rules(self) -> dict:
        """aten target -> export rule."""
        if self.onnx is None:
            return {}
        if callable(self.onnx):
            return dict.fromkeys(self.targets, self.onnx)
        return dict(self.onnx)

    def convert_keys(self) -> list[tuple[tuple[str, str], Callable]]:
        """``((domain, op_type), rule)`` for each convert rule."""
        out = []
        for op_type, rule in self.convert:
            domain, _, name = op_type.rpartition(".")
            out.append(((domain, name), rule))
        return out


def conv_rules(rule: Callable, *op_types: str) -> tuple[tuple[str, Callable], ...]:
    """The same convert rule for several qat.onnx op types."""
    return tuple((t, rule) for t in op_types)


def per_target(
    *groups: tuple[tuple, Callable],
) -> tuple[tuple, tuple[tuple[object, Callable], ...]]:
    """``(targets, rule)`` groups -> (all targets, ``(target, rule)`` pairs) for an entry
    whose targets export differently (``targets, onnx = per_target(...)``)."""
    pairs = tuple((t, rule) for targets, rule in groups for t in targets)
    return tuple(t for t, _ in pairs), pairs
