"""calibrated: QDQ inserted into the optimized float model per a quant config.

Which tensors get a quantizer (the QAT chain's placement, so convert sees the same graph):
- each float graph input: ``input:<name>[input]/q`` -> ``/dq``, writing
  ``input:<name>[input]`` (an integer input, token ids, gets none: ``original`` accepts one
  only as the indices of an embedding, whose constant table is quantized like a class
  token's, below);
- the constant weight of Conv / Gemm / MatMul: ``<layer>[weight]/q`` on the initializer ->
  ``/dq`` writing ``<layer>[weight]``, int8, symmetric per output channel;
- the output of every compute, table and float-island op (:data:`COMPUTE_OPS`,
  :data:`TABLE_OPS`, :data:`ISLAND_OPS`: an island's output goes back onto a grid) and of
  any node named in the overrides: the op writes ``<layer>/raw``, ``<layer>[output]/q`` ->
  ``/dq`` writes ``<layer>``. Not quantized: a conv/linear that is a graph output (high
  precision int32) or whose only user is an add of another tensor (convert fuses the
  requantize into the add); passthrough ops keep their input's scale.
Every node's first output is renamed to its layer id first, so the final float tensor of a
layer is named exactly the layer id (convert's layer table and the runners rely on it).

Calibration (minmax, symmetric): the optimized model runs on the calibration samples with
every observed tensor captured; ``amax = max |x|`` over all samples, and
``scale = max(2 * amax / (qmax - qmin), 2**-24)`` (:func:`simulator.arith.fixedpoint.symmetric_scale`;
int8: ``2 * amax / 255``). Weights: the same per output channel, int8.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas.errors import StageError
from simulator.arith import fixedpoint as fp
from stages.onnx_builder import INT_DTYPES, QUANTIZER_KEY
from stages.onnx_runner import OnnxRunner
from stages.ptq.graph import (
    COMPUTE_OPS,
    ISLAND_OPS,
    TABLE_OPS,
    WEIGHT_AXIS,
    layer_of,
    rename_input,
    set_layer,
    size_nodes,
    users,
)

FLOAT = onnx.TensorProto.FLOAT


@dataclass(frozen=True)
class QuantConfig:
    """The vendor's quant_config, reduced: one activation dtype and per-node overrides."""

    activation_dtype: str = "int8"
    overrides: dict[str, str] = field(default_factory=dict)  # node name or layer id -> dtype
    weight_dtype: str = "int8"


@dataclass
class Plan:
    """Where the quantizers go: layer id -> activation dtype of its output quantizer."""

    outputs: dict[str, str]
    inputs: dict[str, str]  # graph input name -> dtype of its quantizer
    weights: set[str]  # layer ids whose input 1 is a constant weight
    tokens: set[str] = field(default_factory=set)
    """Layer ids of an Expand of a float constant to the batch (a class token) or of a
    Gather of a constant table by run-time indices (an embedding): the constant gets a
    per-tensor weight quantizer, so the Concat it feeds or the lookup stays integer."""


def plan(model: onnx.ModelProto, cfg: QuantConfig, names: dict[str, str]) -> Plan:
    """Decide the quantizers; ``names``: original node name -> layer id (for overrides)."""
    ids = {layer_of(n) for n in model.graph.node}
    xs = [i.name for i in model.graph.input if i.type.tensor_type.elem_type == FLOAT]
    keys = {**{k: v for k, v in names.items() if v in ids}, **{i: i for i in ids}}
    for x in xs:
        keys.update({f"input:{x}": f"input:{x}", x: f"input:{x}"})
    unknown = sorted(k for k in cfg.overrides if k not in keys)
    if unknown:
        raise StageError(
            f"quant overrides name no node of the optimized model: {unknown}",
            where="quant.overrides",
            hint="use node names or layer ids listed in debug/model_check_result.txt "
            "(layers folded away by the optimized stage cannot be overridden)",
        )
    dtype = {keys[k]: v for k, v in cfg.overrides.items()}
    inits = {i.name for i in model.graph.initializer}
    outs: dict[str, str] = {}
    sizes = size_nodes(model)
    for node in model.graph.node:
        lid = layer_of(node)
        if node.name in sizes:
            continue
        if lid in dtype or (
            _quantized(model, node, inits) and node.op_type in COMPUTE_OPS | TABLE_OPS | ISLAND_OPS
        ):
            outs[lid] = dtype.get(lid, cfg.activation_dtype)
    weights = {
        layer_of(n) for n in model.graph.node
        if n.op_type in WEIGHT_AXIS and len(n.input) > 1 and n.input[1] in inits
    }  # fmt: skip
    tokens = {
        layer_of(n) for n in model.graph.node
        if (n.name in sizes and n.op_type == "Expand" and n.input[0] in inits)
        or (n.op_type == "Gather" and n.input[0] in inits and n.input[1] not in inits)
    }  # fmt: skip
    inputs = {x: dtype.get(f"input:{x}", cfg.activation_dtype) for x in xs}
    return Plan(outs, inputs, weights, tokens)


def _quantized(model: onnx.ModelProto, node: onnx.NodeProto, inits: set[str]) -> bool:
    """False for a conv/linear kept at int32: a graph output, or fused into the next add."""
    if node.op_type not in WEIGHT_AXIS:
        return True
    if node.output[0] in {o.name for o in model.graph.output}:
        return False
    readers = users(model.graph)[node.output[0]]
    if len(readers) != 1 or readers[0].op_type not in ("Add", "Sub"):
        return True
    add = readers[0]
    other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
    first = add.input[0] == node.output[0] or _not_accumulator(model, add.input[0])
    return other in inits or not first


def _not_accumulator(model: onnx.ModelProto, name: str) -> bool:
    made = {o: n for n in model.graph.node for o in n.output}
    node = made.get(name)
    return node is None or node.op_type not in WEIGHT_AXIS or len(users(model.graph)[name]) != 1


def name_by_layer(model: onnx.ModelProto) -> None:
    """Rename each node's outputs to its layer id (``<id>:k`` for output k > 0)."""
    for node in model.graph.node:
        lid = layer_of(node)
        for k, old in enumerate(node.output):
            new = lid if k == 0 else f"{lid}:{k}"
            if old and old != new:
                node.output[k] = new
                rename_input(model.graph, old, new)
                for v in model.graph.value_info:
                    if v.name == old:
                        v.name = new


def observe(model: onnx.ModelProto, tensors: list[str], inputs: dict, batch: int) -> dict:
    """``amax = max |t|`` of each tensor over the calibration samples (batch by batch);
    ``inputs``: the samples of every graph input by name."""
    runner = OnnxRunner(model)
    amax = dict.fromkeys(tensors, 0.0)
    capture = [t for t in tensors if t not in inputs]
    for start in range(0, len(next(iter(inputs.values()))), batch):
        xb = {k: v[start : start + batch] for k, v in inputs.items()}
        _, values = runner.run_capture(xb, capture)
        values.update(xb)
        for t in tensors:
            amax[t] = max(amax[t], float(np.max(np.abs(values[t]))))
    return amax


def weight_scale(w: np.ndarray, axis: int, dtype: str) -> np.ndarray:
    """Per-channel symmetric scale: ``amax[c] = max |w[..c..]|`` along every other axis."""
    other = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w.astype(np.float64)), axis=other)
    return np.asarray(fp.symmetric_scale(amax, dtype), dtype=np.float32).reshape(-1)


class QdqWriter:
    """Builds the calibrated graph node by node, in the exporter's naming."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.nodes = model, []
        self.inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.table: list[tuple[str, str, str, str, float]] = []  # for the debug report

    def const(self, name: str, value: np.ndarray) -> str:
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def pair(self, layer: str, tag: str, src: str, dst: str, scale, dtype: str, axis=None):
        """``QuantizeLinear(src)`` -> ``DequantizeLinear`` writing ``dst`` (zero point 0)."""
        s = self.const(f"{tag}/scale", np.asarray(scale, np.float32))
        zp = self.const(f"{tag}/zero_point", np.zeros(np.shape(scale), INT_DTYPES[dtype]))
        kw = {} if axis is None else {"axis": axis}
        q = helper.make_node("QuantizeLinear", [src, s, zp], [f"{tag}/q:0"], name=f"{tag}/q", **kw)
        dq = helper.make_node(
            "DequantizeLinear", [q.output[0], s, zp], [dst], name=f"{tag}/dq", **kw
        )
        for n in (q, dq):
            set_layer(n, layer)
            n.metadata_props.add(key=QUANTIZER_KEY, value=tag)
        self.nodes += [q, dq]
        role = "weight" if axis is not None else tag.rsplit("[", 1)[-1].rstrip("]")
        flat = np.asarray(scale, np.float64).reshape(-1)
        self.table.append((layer, role, dtype, "per_channel" if axis is not None
                           else "per_tensor", float(flat.max())))  # fmt: skip


def insert_qdq(model: onnx.ModelProto, p: Plan, amax: dict[str, float], cfg: QuantConfig):
    """The calibrated model (QDQ inserted; ``model`` is modified) and the quantizer table."""
    w = QdqWriter(model)
    for x, dt in p.inputs.items():
        layer, dq_out = f"input:{x}", f"input:{x}[input]"
        rename_input(model.graph, x, dq_out)
        w.pair(layer, f"{layer}[input]", x, dq_out, fp.symmetric_scale(amax[x], dt), dt)
    for node in list(model.graph.node):
        lid = layer_of(node)
        if lid in p.weights:
            axis = WEIGHT_AXIS[node.op_type]
            wt = w.inits[node.input[1]]
            w.pair(lid, f"{lid}[weight]", node.input[1], f"{lid}[weight]",
                   weight_scale(wt, axis, cfg.weight_dtype), cfg.weight_dtype, axis)  # fmt: skip
            node.input[1] = f"{lid}[weight]"
        if lid in p.tokens:
            wt = w.inits[node.input[0]]
            scale = fp.symmetric_scale(float(np.max(np.abs(wt))), cfg.weight_dtype)
            w.pair(lid, f"{lid}[weight]", node.input[0], f"{lid}[weight]", scale,
                   cfg.weight_dtype)  # fmt: skip
            node.input[0] = f"{lid}[weight]"
        w.nodes.append(node)
        if lid in p.outputs:
            node.output[0] = f"{lid}/raw"
            dt = p.outputs[lid]
            w.pair(
                lid, f"{lid}[output]", node.output[0], lid, fp.symmetric_scale(amax[lid], dt), dt
            )
    del model.graph.node[:]
    model.graph.node.extend(w.nodes)
    del model.graph.value_info[:]
    onnx.checker.check_model(model)
    return model, w.table


def render_quantizers(table) -> str:
    """debug/ptq_quantizers.txt: one line per quantizer."""
    lines = ["# layer_id | role | dtype | qscheme | scale (max over channels)"]
    lines += [f"{a} | {b} | {c} | {d} | {e:.6g}" for a, b, c, d, e in sorted(table)]
    return "\n".join(lines) + "\n"
