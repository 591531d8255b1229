"""Export a prepared (QAT) GraphModule to a QDQ ONNX graph that keeps canonical layer ids.

The ModelProto is built with ``onnx.helper`` directly (opset 21 plus the ``qparity``
domain, version 1): torch.onnx loses module paths and cannot write int16 per-channel Q/DQ
(docs/environment.md, "ONNX"). What each fx node becomes:

- QFakeQuantize with fake quant on: ``QuantizeLinear`` -> ``DequantizeLinear`` (``bpu_round``:
  ``qparity::QuantizeLinear``, since ONNX rounds half to even); fake quant off: nothing.
- FixedPointOp: ``QuantizeLinear(in_scale)`` -> ``qparity::<onnx_op>`` -> ``DequantizeLinear``.
- aten ops: the export rules of the op table (:func:`stages.ops.onnx_rules`).

Naming contract: every ONNX node is named after its layer (``conv``, ``conv/1`` for the
2nd node of a translation, ``conv[output]/q`` and ``/dq`` for quantizers) and carries
``metadata_props["qparity.layer_id"]``. The final float tensor of a layer (after its output
quantizer when it has one) is named exactly the layer id, so runners capture by name.

Checking: ``onnx.checker.check_model(full_check=True)`` passes; custom-domain nodes are
skipped by ONNX shape inference, so their outputs get an explicit ``value_info`` type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.fx
from onnx import helper

from schemas.errors import StageError
from schemas.fileio import atomic_save
from stages.fake_quant import QFakeQuantize, quantizers
from stages.layers import ID_KEY, is_tensor_node
from stages.onnx_builder import (
    DOMAIN,
    INT_DTYPES,
    LAYER_KEY,
    QUANTIZER_KEY,
    GraphBuilder,
    trace_shapes,
)
from stages.ops import onnx_rules

__all__ = [
    "DOMAIN",
    "LAYER_KEY",
    "OPSET",
    "QUANTIZER_KEY",
    "ExportResult",
    "GraphBuilder",
    "export_onnx",
    "render_graph_text",
    "trace_shapes",
]

OPSET = 21
_RULES = onnx_rules()


@dataclass
class ExportResult:
    """The exported graph and how its layers map to the torch graph's canonical ids."""

    model: onnx.ModelProto
    layer_ids: list[str]  # mapped layers, topological order
    unmapped: dict[str, str] = field(default_factory=dict)  # layer id -> reason
    path: Path | None = None


# -- the export ---------------------------------------------------------------------------
def export_onnx(
    gm: torch.fx.GraphModule,
    example: torch.Tensor,
    path: Path | None = None,
    expected_ids: list[str] | None = None,
) -> ExportResult:
    """Build, check and (with ``path``) save the QDQ ONNX graph of ``gm``.

    ``example`` (any batch size) is run through the graph twice, with batch B and B+1, to
    learn every tensor's shape and which dims follow the symbolic "batch".
    ``expected_ids`` (e.g. the float graph's ids) that no node carries, such as a batch
    norm folded into its conv, are reported in ``unmapped``.
    """
    quantizers(gm)  # every quantizer gets a name
    b = GraphBuilder(gm, _final_names(gm), trace_shapes(gm, example))
    mapped, unmapped, inputs, outputs = [], {}, [], []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            inputs.append(_input(b, node, first=not inputs))
        elif node.op == "call_module":
            _call_module(b, node, mapped)
        elif node.op == "call_function" and is_tensor_node(node):
            _call_function(b, node, mapped, unmapped)
        elif node.op == "output":
            outputs = _outputs(b, node)
    for layer in expected_ids or []:
        if layer not in mapped and layer not in unmapped:
            unmapped[layer] = "not in the exported graph (folded before export, e.g. BN)"
    model = _model(b, inputs, outputs)
    if path is not None:
        atomic_save(path, lambda tmp: onnx.save(model, tmp))
    return ExportResult(model, mapped, unmapped, path)


def _final_names(gm: torch.fx.GraphModule) -> dict[str, str]:
    """fx node -> reserved tensor name: the layer id goes to the layer's last float tensor
    (its output quantizer's DequantizeLinear when active), ``<id>/raw`` to the op before."""
    final = {}
    for node in gm.graph.nodes:
        layer = _layer_of(gm, node)
        if not layer:
            continue
        q = next((u for u in node.users if _active_quantizer(gm, u)), None)
        if q is not None:
            final[q.name], final[node.name] = layer, f"{layer}/raw"
        else:
            final[node.name] = layer
    return final


def _layer_of(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
    if node.op == "call_function" and is_tensor_node(node):
        return node.meta.get(ID_KEY) or node.name
    if node.op == "call_module":
        return getattr(gm.get_submodule(node.target), "layer_id", None)
    return None


def _active_quantizer(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op != "call_module":
        return False
    mod = gm.get_submodule(node.target)
    return isinstance(mod, QFakeQuantize) and bool(mod.fake_quant_enabled[0])


def _input(b: GraphBuilder, node, first: bool) -> onnx.ValueInfoProto:
    """Graph input (the first is "x") with its traced dtype and a symbolic "batch" dim."""
    name = "x" if first else node.name
    b.unique(name)
    b.env[node.name] = name
    return b.info(name, node, dynamic="batch")


def _call_function(b: GraphBuilder, node, mapped: list, unmapped: dict) -> None:
    """Translate one aten node with its rule; name its output after the layer."""
    layer = node.meta.get(ID_KEY) or node.name
    b.begin(node, layer)
    rule = _RULES.get(node.target)
    if rule is None:
        hint = "see docs/design.md 'Op coverage'"
        raise b.fail(f"no ONNX translation for {node.target}", hint=hint)
    out = rule(b, node)
    if isinstance(out, list):
        b.env[node.name] = _name_only_output(b, node, out)
        mapped.append(layer)
    elif b.bind(node, out, b.final[node.name]):
        mapped.append(layer)
    else:
        unmapped[layer] = f"identity op {node.target} folded away (same tensor as its input)"


def _name_only_output(b: GraphBuilder, node, outs: list[str]) -> list[str]:
    """A multi-output op with one exported output (adaptive max pool's values, not its
    indices): that output carries the layer's name, as a single-output op's does, so the
    layer has its own tensor in every later stage."""
    live = [o for o in outs if o]
    if len(live) != 1 or not b.rename(live[0], b.final[node.name]):
        return outs
    return [b.final[node.name] if o else o for o in outs]


def _call_module(b: GraphBuilder, node, mapped: list) -> None:
    mod = b.gm.get_submodule(node.target)
    if isinstance(mod, QFakeQuantize):
        _quantizer(b, node, mod)
    elif getattr(mod, "onnx_op", ""):
        _fixed_point(b, node, mod)
        mapped.append(mod.layer_id)
    elif node.target != "_guards_fn":
        b.begin(node, str(node.target))
        raise b.fail(f"no ONNX translation for module {type(mod).__name__}")


def _qparams(b: GraphBuilder, scale, dtype: str, tag: str, per_channel=False) -> tuple[str, str]:
    """Scale (0-d per tensor, 1-D per channel) and a zero point of the quantized dtype."""
    s = np.asarray(scale, np.float32)
    s = s if per_channel else s.reshape(())
    zp = np.zeros(s.shape, INT_DTYPES[dtype])
    return b.const(s, f"{tag}/scale"), b.const(zp, f"{tag}/zero_point")


def _quantizer(b: GraphBuilder, node, fq: QFakeQuantize) -> None:
    """Fake quant -> Q/DQ (the DQ output named the layer for output quantizers)."""
    src = b.arg(node.args[0])
    if not bool(fq.fake_quant_enabled[0]):
        b.env[node.name] = src  # FLOAT / CALIBRATION state: identity
        return
    b.begin(node, fq.name.rsplit("[", 1)[0] or str(node.target))
    if not fq.is_frozen:
        raise b.fail(f"quantizer {fq.name} has no frozen scale", hint="calibrate and freeze")
    per_channel = fq.ch_axis is not None
    s, zp = _qparams(b, fq.scale.detach().cpu(), fq.qdtype, fq.name, per_channel)
    axis = fq.ch_axis if per_channel else None
    if fq.rounding == "half_even":
        q = b.emit("QuantizeLinear", [src, s, zp], name=f"{fq.name}/q", axis=axis)
    else:
        q = b.emit("QuantizeLinear", [src, s], domain=DOMAIN, name=f"{fq.name}/q",
                   axis=axis if per_channel else 1, dtype=fq.qdtype, rounding=fq.rounding)  # fmt: skip
        b.typed(q, fq.qdtype)
    y = b.emit("DequantizeLinear", [q, s, zp], name=f"{fq.name}/dq", axis=axis)
    for n in b.nodes[b.start :]:
        n.metadata_props.add(key=QUANTIZER_KEY, value=fq.name)
    b.bind(node, y, b.final.get(node.name, fq.name))


def _fixed_point(b: GraphBuilder, node, mod) -> None:
    """Q(in_scale) -> qparity::<onnx_op>(q, *tables) -> DQ(out_scale)."""
    layer = mod.layer_id
    b.begin(node, layer)
    attrs, tables = mod.encode()
    s_in, zp_in = _qparams(b, mod.in_scale, mod.in_dtype, f"{layer}/in")
    s_out, zp_out = _qparams(b, mod.out_scale, mod.out_dtype, f"{layer}/out")
    q = b.emit("QuantizeLinear", [b.arg(node.args[0]), s_in, zp_in], name=f"{layer}/q")
    names = [b.const(np.asarray(v), f"{layer}/{k}") for k, v in tables.items()]
    out = b.emit(mod.onnx_op, [q, *names], domain=DOMAIN, name=layer, attrs=attrs)
    b.typed(out, mod.out_dtype)
    y = b.emit("DequantizeLinear", [out, s_out, zp_out], name=f"{layer}/dq")
    b.bind(node, y, b.final[node.name])


def _outputs(b: GraphBuilder, node) -> list[onnx.ValueInfoProto]:
    """Graph outputs; an input, initializer or repeated tensor goes through an Identity."""
    flat, outs, seen = torch.utils._pytree.tree_leaves(node.args[0]), [], set()
    for i, src in enumerate(flat):
        b.begin(node, f"output/{i}")
        name = b.arg(src)
        if name in seen or name in b.inits or not any(name in n.output for n in b.nodes):
            name = b.emit("Identity", [name])
        seen.add(name)
        outs.append(b.info(name, src, dynamic=None))
    return outs


def _model(b: GraphBuilder, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(
        b.nodes, "qparity", inputs, outputs, list(b.inits.values()), value_info=b.value_info
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="qparity")
    model.ir_version = 10
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as e:
        raise StageError(f"exported graph fails onnx.checker: {e}", where="export") from e
    return model


def render_graph_text(model: onnx.ModelProto) -> str:
    """One numbered line per node (like the vendor's ``get_asm(enable_debug_info=True)``):
    ``index | name | domain::op_type | layer_id | inputs -> outputs | key attrs``."""
    lines = []
    for i, n in enumerate(model.graph.node):
        meta = {p.key: p.value for p in n.metadata_props}
        attrs = ", ".join(
            f"{a.name}={_fmt(helper.get_attribute_value(a))}"
            for a in n.attribute
            if a.type in _SHOWN
        )
        lines.append(
            f"{i} | {n.name} | {n.domain or 'ai.onnx'}::{n.op_type} | {meta.get(LAYER_KEY, '')}"
            f" | {', '.join(n.input)} -> {', '.join(n.output)} | {attrs}"
        )
    return "\n".join(lines) + "\n"


_A = onnx.AttributeProto
_SHOWN = (_A.INT, _A.FLOAT, _A.STRING, _A.INTS, _A.FLOATS, _A.STRINGS)


def _fmt(value) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and len(value) > 8:
        return f"[{', '.join(map(_fmt, value[:8]))}, ... ({len(value)})]"
    if isinstance(value, list):
        return f"[{', '.join(map(_fmt, value))}]"
    return f"{value:.6g}" if isinstance(value, float) else str(value)
