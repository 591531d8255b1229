"""qat.onnx (QuantizeLinear/DequantizeLinear pairs) -> quantized.onnx (integer tensors).

The walk keeps, for every float tensor of qat.onnx that is a dequantized integer, its
integer form (:class:`QTensor`: integer tensor name, scale, dtype, channel axis).
- DequantizeLinear nodes disappear: their output is just known to be ``q * scale``.
- A weight QuantizeLinear on an initializer becomes an integer initializer.
- A compute op whose inputs are integers and whose output feeds its output quantizer
  becomes one integer op with requantize (:mod:`stages.convert.compute`); with no output
  quantizer, a conv/linear keeps its int32 accumulator (high precision, or fused with the
  next add).
- Layout and selection ops (reshape, max-pool, relu, slice...) run on the integers.
- Anything else stays a float island: DequantizeLinear in, the op, QuantizeLinear out.
Every node keeps the canonical layer id of the node it came from.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas.errors import SimulatorError, StageError
from stages.onnx_builder import DOMAIN, LAYER_KEY

ZP = {"int8": np.int8, "int16": np.int16, "int32": np.int32}


@dataclass(frozen=True)
class ConvertSettings:
    """The arithmetic choices convert makes (recorded in the run)."""

    multiplier_bits: int = 16  # signed width: |m| < 2**(bits-1)
    rounding: str = "half_even"
    fuse_requantize: bool = True


@dataclass(frozen=True)
class QTensor:
    """The integer form of a float tensor: ``float = int * scale`` (per ``axis`` if set)."""

    name: str
    scale: np.ndarray
    dtype: str
    axis: int | None = None


class Converter:
    """One conversion; :meth:`run` returns the integer model and its layer table."""

    def __init__(self, model: onnx.ModelProto, settings: ConvertSettings):
        self.src, self.settings = model, settings
        self.inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.users: dict[str, list[int]] = defaultdict(list)
        for k, node in enumerate(model.graph.node):
            for name in node.input:
                self.users[name].append(k)
        self.qt: dict[str, QTensor] = {}  # float tensor -> its integer form
        self.ints: dict[str, QTensor] = {}  # integer tensor of qat.onnx -> our integer form
        self.floats: set[str] = {i.name for i in model.graph.input} | set(self.inits)
        self.nodes: list[onnx.NodeProto] = []
        self.new_inits: dict[str, np.ndarray] = {}
        self.skip: set[int] = set()
        self.islands: set[str] = set()  # layer ids left in float
        self.layer = ""

    # -- emitting -------------------------------------------------------------------

    def emit(
        self,
        op_type: str,
        inputs: list[str],
        outputs: list[str],
        domain: str = "",
        attrs: dict | None = None,
        **kw,
    ) -> None:
        """Append a node tagged with the current layer id (``attrs``: copied attributes)."""
        node = helper.make_node(
            op_type,
            inputs,
            outputs,
            name=f"{self.layer}/{len(self.nodes)}",
            domain=domain,
            **{**(attrs or {}), **kw},
        )
        node.metadata_props.add(key=LAYER_KEY, value=self.layer)
        self.nodes.append(node)

    def const(self, tag: str, value) -> str:
        """A new initializer (named after the current layer) holding ``value``."""
        name = f"{self.layer}/{tag}#{len(self.new_inits)}"
        self.new_inits[name] = np.asarray(value)
        return name

    def float_of(self, name: str) -> str:
        """The float tensor ``name``, dequantizing its integer form on first use."""
        if name in self.floats or name not in self.qt:
            return name
        q = self.qt[name]
        scale = self.const("dq_scale", q.scale.astype(np.float32))
        zero = self.const("dq_zero", np.zeros(q.scale.shape, ZP[q.dtype]))
        attrs = {"axis": q.axis} if q.axis is not None and q.scale.size > 1 else {}
        self.emit("DequantizeLinear", [q.name, scale, zero], [name], **attrs)
        self.floats.add(name)
        return name

    # -- the walk ----------------------------------------------------------------------

    def run(self) -> tuple[onnx.ModelProto, dict[str, QTensor]]:
        """Convert every node in order; returns (quantized model, layer id -> integers)."""
        from stages.ops import convert_rules

        table = convert_rules()
        for k, node in enumerate(self.src.graph.node):
            if k in self.skip:
                continue
            self.layer = _layer_id(node)
            rule = table.get((node.domain or "", node.op_type))
            try:
                if rule is None or not rule(self, k, node):
                    self.float_island(node)
            except SimulatorError as e:  # the integer arithmetic refused a scale
                raise StageError(
                    f"cannot convert node {k} ({node.op_type} {node.name!r}): {e.what}",
                    where=f"convert, layer {self.layer}",
                    hint=e.hint,
                ) from e
            except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
                raise StageError(
                    f"cannot convert node {k} ({node.op_type} {node.name!r}): "
                    f"{type(e).__name__}: {e}",
                    where=f"convert, layer {self.layer}",
                    hint="the graph is not one qparity's export writes: rerun export "
                    "(or, for an edited graph, undo the edit of this node)",
                ) from e
        for out in self.src.graph.output:
            self.float_of(out.name)
        return self.model(), self.layer_table()

    def float_island(self, node: onnx.NodeProto) -> None:
        """Keep a node in float: dequantize its integer inputs first."""
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            self.islands.add(self.layer)
        inputs = [self.float_of(n) if n else n for n in node.input]
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        self.nodes.append(copy)
        self.floats.update(node.output)

    def output_quantizer(self, k: int, node: onnx.NodeProto) -> onnx.NodeProto | None:
        """The QuantizeLinear that is the only consumer of the node's output, if any."""
        users = self.users[node.output[0]]
        if len(users) == 1:
            q = self.src.graph.node[users[0]]
            if q.op_type == "QuantizeLinear":
                return q
        return None

    def q_params(self, q: onnx.NodeProto) -> tuple[np.ndarray, str, int | None]:
        """(scale, dtype, axis) of a QuantizeLinear/DequantizeLinear, scale checked."""
        scale = np.asarray(self.inits[q.input[1]], dtype=np.float64)
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise StageError(
                f"quantizer scale {scale.ravel()[:4]} is zero, negative or NaN",
                where=f"layer {self.layer}",
                hint="recalibrate: the quantizer saw no data or non-finite data",
            )
        dtype = (
            _attr(q, "dtype")
            if q.domain == DOMAIN
            else str(self.inits[q.input[2]].dtype)
            if len(q.input) > 2
            else "int8"
        )
        dtype = dtype.decode() if isinstance(dtype, bytes) else dtype  # custom-domain string attr
        axis = _attr(q, "axis") if scale.size > 1 else None
        return scale, dtype, (1 if axis is None and scale.size > 1 else axis)

    def produce(self, q: onnx.NodeProto, qt: QTensor, k_q: int | None = None) -> None:
        """Record that qat.onnx's integer tensor ``q.output[0]`` is ``qt``."""
        self.ints[q.output[0]] = qt
        if k_q is not None:
            self.skip.add(k_q)

    def model(self) -> onnx.ModelProto:
        """The integer model; custom ops keep the output types qat.onnx declares for them."""
        inits = [numpy_helper.from_array(v, k) for k, v in self.new_inits.items()]
        used = {n for node in self.nodes for n in node.input}
        inits += [i for i in self.src.graph.initializer if i.name in used]
        graph = helper.make_graph(
            self.nodes,
            self.src.graph.name + "_quantized",
            list(self.src.graph.input),
            list(self.src.graph.output),
            inits,
            value_info=self.declared_types(),
        )
        model = helper.make_model(graph, opset_imports=list(self.src.opset_import))
        model.ir_version = self.src.ir_version
        return model

    def declared_types(self) -> list[onnx.ValueInfoProto]:
        """qat.onnx's declared types of the tensors this model still makes: without them
        the reference evaluator leaves a table op's result int64, and a DequantizeLinear
        emitted on it (a float island next to a Lut) fails on its int8 zero point."""
        made = {o for node in self.nodes for o in node.output}
        return [v for v in self.src.graph.value_info if v.name in made]

    def layer_table(self) -> dict[str, QTensor]:
        """Layer id -> integer form of its final tensor (qat.onnx names it by the id);
        the quantized model input as ``input:<name>``. Layers that became constants
        (folded before convert) are not activations and are left out."""
        ids = {_layer_id(n) for n in self.src.graph.node}
        table = {
            name: q for name, q in self.qt.items() if name in ids and q.name not in self.new_inits
        }
        table.update(
            {
                name.removesuffix("[input]"): q
                for name, q in self.qt.items()
                if name.startswith("input:") and name.endswith("[input]")
            }
        )
        return table


def _layer_id(node: onnx.NodeProto) -> str:
    for p in node.metadata_props:
        if p.key == LAYER_KEY:
            return p.value
    return node.name.split("/")[0]


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
