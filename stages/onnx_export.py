"""Export a prepared (QAT) GraphModule to a QDQ ONNX graph that keeps canonical layer ids.

The ModelProto is built with ``onnx.helper`` directly (opset 21 plus the ``qparity``
domain, version 1): torch.onnx loses module paths and cannot write int16 per-channel Q/DQ
(NOTES.md, "ONNX"). What each fx node becomes:

- QFakeQuantize with fake quant on: ``QuantizeLinear`` -> ``DequantizeLinear`` (``bpu_round``:
  ``qparity::QuantizeLinear``, since ONNX rounds half to even); fake quant off: nothing.
- FixedPointOp: ``QuantizeLinear(in_scale)`` -> ``qparity::<onnx_op>`` -> ``DequantizeLinear``.
- aten ops: the rules of :mod:`stages.onnx_ops`.

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
from onnx import TensorProto, helper, numpy_helper

from schemas.errors import StageError
from stages.fake_quant import QFakeQuantize, quantizers
from stages.layers import ID_KEY, is_tensor_node
from stages.onnx_ops import rules

DOMAIN = "qparity"
OPSET = 21
LAYER_KEY = "qparity.layer_id"
QUANTIZER_KEY = "qparity.quantizer"
_ONNX_INT = {"int8": np.int8, "int16": np.int16, "int32": np.int32}
_RULES = rules()


@dataclass
class ExportResult:
    """The exported graph and how its layers map to the torch graph's canonical ids."""

    model: onnx.ModelProto
    layer_ids: list[str]  # mapped layers, topological order
    unmapped: dict[str, str] = field(default_factory=dict)  # layer id -> reason
    path: Path | None = None


class GraphBuilder:
    """Accumulates ONNX nodes and initializers for one fx graph; the rules' API."""

    def __init__(self, gm: torch.fx.GraphModule, final: dict[str, str], traced: dict):
        self.gm, self.final = gm, final  # fx node name -> its reserved tensor name
        self.traced = traced  # fx node name -> (shape, dtype) or a list of them
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, TensorProto] = {}
        self.value_info: list[onnx.ValueInfoProto] = []
        self.env: dict[str, str | list[str]] = {}
        self._tensors: set[str] = set(final.values())  # reserved for the layers
        self._node_names: set[str] = set()
        self.node: torch.fx.Node | None = None
        self.layer, self._count, self.start = "", 0, 0

    def begin(self, node: torch.fx.Node, layer: str) -> None:
        """Start translating ``node`` (its nodes are named after ``layer``)."""
        self.node, self.layer, self._count, self.start = node, layer, 0, len(self.nodes)

    def unique(self, name: str, used: set[str] | None = None) -> str:
        """``name``, or ``name#k`` when taken."""
        used = self._tensors if used is None else used
        out, k = name, 1
        while out in used:
            out, k = f"{name}#{k}", k + 1
        used.add(out)
        return out

    def fail(self, what: str, hint: str | None = None) -> StageError:
        """A StageError naming the current fx node and layer id."""
        node = self.node.name if self.node is not None else "?"
        return StageError(what, where=f"export, node {node} (layer {self.layer})", hint=hint)

    # -- values -------------------------------------------------------------------------
    def args(self, node: torch.fx.Node) -> dict:
        """The node's arguments by schema name, defaults filled in."""
        schema = node.target._schema
        out = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args):
                out[a.name] = node.args[i]
            elif a.name in node.kwargs:
                out[a.name] = node.kwargs[a.name]
            else:
                out[a.name] = a.default_value if a.has_default_value() else None
        return out

    def arg(self, a, like: torch.fx.Node | None = None) -> str:
        """Tensor name of an fx value; a Python number becomes a 0-d initializer."""
        if isinstance(a, torch.fx.Node):
            if a.op == "get_attr" and a.name not in self.env:
                self.env[a.name] = self._attr(a)
            value = self.env.get(a.name)
            if not isinstance(value, str):
                raise self.fail(f"input {a.name} is not a single tensor")
            return value
        if isinstance(a, bool | int | float):
            dtype = self.dtype(like) if like is not None else torch.float32
            return self.const(torch.tensor(a, dtype=dtype).numpy())
        raise self.fail(f"unsupported argument {a!r}")

    def _attr(self, node: torch.fx.Node) -> str:
        """Initializer of a parameter / buffer / lifted constant (get_attr)."""
        value = self.gm
        for part in node.target.split("."):
            value = getattr(value, part)
        array = value.detach().cpu().numpy()
        return self.const(
            array.astype(np.float32) if array.dtype == np.float64 else array, node.target
        )

    def const(self, array: np.ndarray, name: str | None = None) -> str:
        """Add an initializer (named after the current layer unless ``name``)."""
        name = self.unique(name or f"{self.layer}/c{len(self.inits)}")
        self.inits[name] = numpy_helper.from_array(np.array(array, order="C"), name)
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64))

    def item(self, src: torch.fx.Node, idx: int) -> str:
        value = self.env.get(src.name)
        if not isinstance(value, list) or not value[idx]:
            raise self.fail(f"output {idx} of {src.name} is not exported")
        return value[idx]

    def _traced(self, a: torch.fx.Node):
        found = self.traced.get(a.name)
        if found is None:
            raise self.fail(f"no traced shape for {a.name}")
        return found

    def shape(self, a: torch.fx.Node) -> tuple:
        """Traced shape: ints, and ``"<k>*batch<+c>"`` strings for dynamic dims."""
        return self._traced(a)[0]

    def shapes(self, node: torch.fx.Node) -> list[tuple]:
        """Traced shapes of a multi-output op (split, chunk)."""
        return [s for s, _ in self._traced(node)]

    def out_shape(self, node: torch.fx.Node) -> tuple:
        return self.shape(node)

    def rank(self, a: torch.fx.Node) -> int:
        return len(self.shape(a))

    def numel(self, a: torch.fx.Node) -> int:
        return int(np.prod(self.shape(a)))

    def dtype(self, a: torch.fx.Node) -> torch.dtype:
        return self._traced(a)[1]

    def multi(self, node: torch.fx.Node) -> bool:
        """True when the op returns several tensors (getitem picks one)."""
        return isinstance(self._traced(node), list)

    # -- nodes --------------------------------------------------------------------------
    def emit(self, op: str, inputs: list[str], n_out: int = 1, domain: str = "",
             name: str | None = None, attrs: dict | None = None, **kw) -> str | list[str]:  # fmt: skip
        """Append one node; returns its output name(s) (``<node name>:<i>``).

        Attributes come as keywords, or as ``attrs`` when their names are arbitrary
        (custom ops)."""
        attrs = {**(attrs or {}), **kw}
        if name is None:
            name = self.layer if self._count == 0 else f"{self.layer}/{self._count}"
        self._count += 1
        name = self.unique(name, self._node_names)
        outs = [self.unique(f"{name}:{i}") for i in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = helper.make_node(op, inputs, outs, name, domain=domain, **attrs)
        node.metadata_props.add(key=LAYER_KEY, value=self.layer)
        self.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def typed(self, tensor: str, dtype: str) -> None:
        """Declare the integer type of a custom-op output (shape inference skips them)."""
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(_ONNX_INT[dtype]))
        self.value_info.append(helper.make_tensor_value_info(tensor, elem, None))

    def rename(self, old: str, new: str) -> bool:
        """Give a tensor made by the current translation its reserved name.

        False if ``old`` was made earlier (the op aliased its input)."""
        mine = self.nodes[self.start :]
        if not any(old in n.output for n in mine):
            return False
        for n in mine:
            for seq in (n.input, n.output):
                for i, t in enumerate(seq):
                    if t == old:
                        seq[i] = new
        for vi in self.value_info:
            vi.name = new if vi.name == old else vi.name
        return True


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
        onnx.save(model, str(path))
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
    shape = [d if isinstance(d, int) else "batch" for d in b.shape(node)]
    return helper.make_tensor_value_info(name, _elem(b.dtype(node)), shape)


def _elem(dtype: torch.dtype) -> int:
    """ONNX element type of a torch dtype."""
    return helper.np_dtype_to_tensor_dtype(torch.empty(0, dtype=dtype).numpy().dtype)


class _ShapeRun(torch.fx.Interpreter):
    """Runs the graph with quantizers as identity (no observer sees the batch)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.seen: dict[str, object] = {}

    def run_node(self, n: torch.fx.Node):
        value = super().run_node(n)
        if isinstance(value, torch.Tensor):
            self.seen[n.name] = (tuple(value.shape), value.dtype)
        elif isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
            self.seen[n.name] = [(tuple(v.shape), v.dtype) for v in value]
        return value

    def call_module(self, target, args, kwargs):
        if isinstance(self.module.get_submodule(target), QFakeQuantize):
            return args[0]
        return super().call_module(target, args, kwargs)


def trace_shapes(gm: torch.fx.GraphModule, example: torch.Tensor) -> dict[str, object]:
    """Shapes and dtypes of every node, from two runs with batch B and B+1.

    A dim that moves with the batch is written ``"<k>*batch<+c>"`` (torch.export's meta
    shapes are not used: nodes rewritten after export, e.g. eval batch norm, carry the
    pattern's example shapes).
    """
    base = example.repeat((2,) + (1,) * (example.ndim - 1))[: max(2, len(example))]
    runs = []
    for x in (base, torch.cat([base, base[:1]])):
        interp = _ShapeRun(gm)
        with torch.no_grad():
            interp.run(x)
        runs.append(interp.seen)
    batch = len(base)

    def merge(a, b):
        if isinstance(a, list):
            return [merge(u, v) for u, v in zip(a, b, strict=True)]
        dims = tuple(
            d if d == e else _symbol(d, e - d, batch) for d, e in zip(a[0], b[0], strict=True)
        )
        return dims, a[1]

    return {k: merge(v, runs[1][k]) for k, v in runs[0].items() if k in runs[1]}


def _symbol(d: int, k: int, batch: int) -> str:
    """The dim ``d`` at batch ``batch`` that grows by ``k`` per sample: ``k*batch+c``."""
    c = d - k * batch
    return f"{k}*batch" + (f"{c:+d}" if c else "")


def _call_function(b: GraphBuilder, node, mapped: list, unmapped: dict) -> None:
    """Translate one aten node with its rule; name its output after the layer."""
    layer = node.meta.get(ID_KEY) or node.name
    b.begin(node, layer)
    rule = _RULES.get(node.target)
    if rule is None:
        raise b.fail(f"no ONNX translation for {node.target}", hint="see DESIGN.md 'Op coverage'")
    out = rule(b, node)
    b.env[node.name] = out
    if isinstance(out, list):
        mapped.append(layer)
    elif b.rename(out, b.final[node.name]):
        b.env[node.name] = b.final[node.name]
        mapped.append(layer)
    else:
        unmapped[layer] = f"identity op {node.target} folded away (same tensor as its input)"


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
    zp = np.zeros(s.shape, _ONNX_INT[dtype])
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
    final = b.final.get(node.name, fq.name)
    b.env[node.name] = final if b.rename(y, final) else y


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
    b.rename(y, b.final[node.name])
    b.env[node.name] = b.final[node.name]


def _outputs(b: GraphBuilder, node) -> list[onnx.ValueInfoProto]:
    """Graph outputs; an input, initializer or repeated tensor goes through an Identity."""
    flat, outs, seen = torch.utils._pytree.tree_leaves(node.args[0]), [], set()
    for i, src in enumerate(flat):
        b.begin(node, f"output/{i}")
        name = b.arg(src)
        if name in seen or name in b.inits or not any(name in n.output for n in b.nodes):
            name = b.emit("Identity", [name])
        seen.add(name)
        shape = [d if isinstance(d, int) else None for d in b.shape(src)]
        elem = _elem(b.dtype(src))
        outs.append(helper.make_tensor_value_info(name, elem, shape))
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
