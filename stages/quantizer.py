"""qparity's torchao PT2E Quantizer: where fake quant goes, with which dtype and scale rule.

Placement (the Nash BPU's rules, docs/design.md "Numerics"):
- conv/linear: input activation per tensor, weight int8 per output channel (axis 0),
  output activation per tensor; a conv/linear that is a model output stays unquantized
  when ``high_precision_output`` (int32 on the board).
- every other value-producing op (add, mul, pooling, tables, softmax...) gets an output
  quantizer; passthrough ops (reshape, relu, max-pool, slice...) reuse their input's scale
  and get none, since they are exact on integers.
- a consumer whose input is not quantized yet (a graph input, a constant) quantizes it.
- integer values (token ids, an int64 attention mask, an op computing only on them) get no
  quantizer: they are exact; a float op reading one casts it (export), unquantized.
With ``fuse_requantize`` a conv/linear feeding only an add/sub has no output quantizer
(the BPU requantizes conv + add once). Activation dtype: the spec's default, overridden per module path (a key matches the path
and everything below it). Scales: ``s = 2*amax/(qmax-qmin)``, rounded up to a power of two
for activations at consistency level >= 1 and for weights at level 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
)

from schemas.errors import SpecError
from stages.fake_quant import QFakeQuantize
from stages.layers import ID_KEY, Category, classify, is_tensor_node
from stages.ops import ACCUMULATOR_USERS, PARAM_OPS

TORCH_DTYPES = {"int8": torch.int8, "int16": torch.int16}
# Ops whose trailing tensor inputs are parameters: how many leading inputs are activations.
QRANGES = {"int8": (-128, 127), "int16": (-32768, 32767)}


@dataclass(frozen=True)
class QuantPolicy:
    """The quantization settings prepare applies (taken from the spec's ``quant``)."""

    activation_dtype: str = "int8"
    overrides: dict[str, str] = field(default_factory=dict)
    observer: str = "minmax"
    rounding: str = "half_even"
    pot_activations: bool = False
    pot_weights: bool = False
    high_precision_output: bool = True
    fuse_requantize: bool = False
    percentile: float = 99.99
    averaging_constant: float = 0.01

    def dtype_for(self, layer_id: str) -> str:
        """Activation dtype of a layer: the longest matching override, else the default."""
        best, dtype = -1, self.activation_dtype
        for path, d in self.overrides.items():
            if (layer_id == path or layer_id.startswith(path + ".")) and len(path) > best:
                best, dtype = len(path), d
        return dtype


def _activation_spec(policy: QuantPolicy, dtype: str) -> QuantizationSpec:
    qmin, qmax = QRANGES[dtype]
    ctr = QFakeQuantize.with_args(
        observer=policy.observer,
        rounding=policy.rounding,
        pot=policy.pot_activations,
        ch_axis=None,
        percentile=policy.percentile,
        averaging_constant=policy.averaging_constant,
    )
    return QuantizationSpec(
        dtype=TORCH_DTYPES[dtype],
        quant_min=qmin,
        quant_max=qmax,
        qscheme=torch.per_tensor_symmetric,
        observer_or_fake_quant_ctr=ctr,
    )


def _weight_spec(policy: QuantPolicy) -> QuantizationSpec:
    ctr = QFakeQuantize.with_args(
        observer="minmax", rounding=policy.rounding, pot=policy.pot_weights, ch_axis=0
    )
    return QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=ctr,
    )


class NashQuantizer(Quantizer):
    """Annotates an exported graph (ids already assigned) per :class:`QuantPolicy`."""

    def __init__(self, policy: QuantPolicy):
        super().__init__()
        self.policy = policy

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        self._check_overrides(model)
        quantized: set[torch.fx.Node] = set()
        self._fused: set[torch.fx.Node] = set()
        outputs = _output_producers(model)
        for node in model.graph.nodes:
            if not is_tensor_node(node):
                continue
            _, cat = classify(node)
            if cat is None:
                continue
            if cat is Category.PASSTHROUGH:
                if node.args and _is_quantized(node.args[0], quantized):
                    quantized.add(node)
                continue
            self._annotate_node(node, cat, quantized, outputs)
        return model

    def _annotate_node(self, node, cat, quantized, outputs) -> None:
        dtype = self.policy.dtype_for(node.meta.get(ID_KEY, node.name))
        act = _activation_spec(self.policy, dtype)
        inputs = {}
        tensor_args = [a for a in _flat_args(node) if isinstance(a, torch.fx.Node)]
        op_type = classify(node)[0]
        if op_type in PARAM_OPS:  # their other tensor inputs are parameters, not activations
            tensor_args = tensor_args[: PARAM_OPS[op_type]]
        for i, arg in enumerate(tensor_args):
            if cat is Category.WEIGHTED and i == 1:
                inputs[arg] = _weight_spec(self.policy)
            elif cat is Category.WEIGHTED and i == 2:
                continue  # bias: int32 at s_in * s_w, made at convert
            elif arg in self._fused:
                continue  # the int32 accumulator of a fused conv/linear + add
            elif not _is_quantized(arg, quantized) and _is_float_tensor(arg):
                inputs[arg] = act
        high_precision = (
            cat is Category.WEIGHTED and node in outputs and self.policy.high_precision_output
        )
        fused = cat is Category.WEIGHTED and self._fuses(node, outputs)
        integer = _is_integer_tensor(node)  # on integer inputs (a mask's sum): exact as is
        node.meta["quantization_annotation"] = QuantizationAnnotation(
            input_qspec_map=inputs,
            output_qspec=None if high_precision or fused or integer else act,
            _annotated=True,
        )
        if fused:
            self._fused.add(node)
        elif not (high_precision or integer):
            quantized.add(node)

    def _fuses(self, node: torch.fx.Node, outputs) -> bool:
        """fuse_requantize: a conv/linear whose only user is an add/sub of two tensors is
        requantized once, after the add, so QAT has no quantizer between them either (an
        add of a constant has no integer form on an int32 accumulator: not fused)."""
        users = list(node.users)
        return (
            self.policy.fuse_requantize
            and node not in outputs
            and len(users) == 1
            and classify(users[0])[0] in ACCUMULATOR_USERS
            and all(isinstance(a, torch.fx.Node) for a in users[0].args[:2])
        )

    def _check_overrides(self, model: torch.fx.GraphModule) -> None:
        ids = {n.meta[ID_KEY] for n in model.graph.nodes if ID_KEY in n.meta}
        for path in self.policy.overrides:
            if not any(i == path or i.startswith(path + ".") for i in ids):
                known = sorted({i.split(".")[0] for i in ids})
                raise SpecError(
                    f"override '{path}' matches no layer of the model",
                    where="quant.overrides",
                    hint=f"use a module path; top-level paths are: {', '.join(known)}",
                )

    def validate(self, model: torch.fx.GraphModule) -> None:
        """Nothing to validate beyond what annotate checks."""


def _flat_args(node: torch.fx.Node) -> list:
    out = []
    for a in node.args:
        out.extend(a if isinstance(a, (list, tuple)) else [a])
    return out


def _is_float_tensor(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def _is_integer_tensor(node: torch.fx.Node) -> bool:
    """A traced integer (or bool) tensor; a node without a traced value is not one."""
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and not val.is_floating_point()


def _is_quantized(node, quantized: set) -> bool:
    return isinstance(node, torch.fx.Node) and node in quantized


def _output_producers(model: torch.fx.GraphModule) -> set[torch.fx.Node]:
    out = next(n for n in model.graph.nodes if n.op == "output")
    return {a for a in _flat_args(out) if isinstance(a, torch.fx.Node)}
