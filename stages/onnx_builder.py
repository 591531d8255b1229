"""The graph builder behind :func:`stages.onnx_export.export_onnx`, and the shapes it reads.

:class:`GraphBuilder` accumulates the ONNX nodes, initializers and ``value_info`` of one
fx graph; it is the API the translation rules (:mod:`stages.onnx_ops`,
:mod:`stages.onnx_shape_ops`) write through. :func:`trace_shapes` learns every tensor's
shape and dtype, with the dims that follow the symbolic "batch", by running the graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
import torch.fx
from onnx import TensorProto, helper, numpy_helper

from schemas.errors import StageError
from stages.fake_quant import QFakeQuantize

DOMAIN = "qparity"
LAYER_KEY = "qparity.layer_id"
QUANTIZER_KEY = "qparity.quantizer"
INT_DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32}


def elem_type(dtype: torch.dtype) -> int:
    """ONNX element type of a torch dtype."""
    return helper.np_dtype_to_tensor_dtype(torch.empty(0, dtype=dtype).numpy().dtype)


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

    def arg_or(self, a, default: np.ndarray) -> str:
        """Tensor name of an optional fx value; ``default`` as an initializer when None."""
        return self.arg(a) if a is not None else self.const(default)

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
        """An int64 initializer (shapes, axes, pads)."""
        return self.const(np.asarray(values, np.int64))

    def item(self, src: torch.fx.Node, idx: int) -> str:
        """Tensor name of output ``idx`` of the multi-output node ``src``."""
        value = self.env.get(src.name)
        if not isinstance(value, list) or not value[idx]:
            raise self.fail(f"output {idx} of {src.name} is not exported")
        return value[idx]

    def batch_size(self) -> str:
        """An int64 [1] tensor holding the run's batch size: ``Shape(x, 0, 1)`` of the
        first graph input whose dim 0 is the symbolic batch (one per graph)."""
        if "__batch__" not in self.env:
            inputs = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
            x = next(
                (
                    self.env[n.name]
                    for n in inputs
                    if n.name in self.traced and self.shape(n)[:1] == ("1*batch",)
                ),
                None,
            )
            if x is None:
                raise self.fail("no graph input carries the batch dim to expand to")
            self.env["__batch__"] = self.emit("Shape", [x], start=0, end=1)
        return self.env["__batch__"]

    # -- traced shapes ------------------------------------------------------------------
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
        """Traced shape of the node's (single) output."""
        return self.shape(node)

    def rank(self, a: torch.fx.Node) -> int:
        """Number of dims of a traced tensor."""
        return len(self.shape(a))

    def numel(self, a: torch.fx.Node) -> int:
        """Number of elements of a traced tensor (static shapes only)."""
        return int(np.prod(self.shape(a)))

    def dtype(self, a: torch.fx.Node) -> torch.dtype:
        """Traced dtype of a tensor."""
        return self._traced(a)[1]

    def multi(self, node: torch.fx.Node) -> bool:
        """True when the op returns several tensors (getitem picks one)."""
        return isinstance(self._traced(node), list)

    def first_of(self, node: torch.fx.Node, y: str) -> str | list[str]:
        """``y`` as the op's only exported output: other outputs of a multi-output op
        (indices, batch statistics) are left empty, so getitem on them fails."""
        return [y] + [""] * (len(self._traced(node)) - 1) if self.multi(node) else y

    def info(self, name: str, a: torch.fx.Node, dynamic: str | None) -> onnx.ValueInfoProto:
        """Graph input/output type of ``a``'s traced tensor; ``dynamic`` names its
        symbolic dims (None leaves them unnamed)."""
        shape = [d if isinstance(d, int) else dynamic for d in self.shape(a)]
        return helper.make_tensor_value_info(name, elem_type(self.dtype(a)), shape)

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
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(INT_DTYPES[dtype]))
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

    def bind(self, node: torch.fx.Node, out: str, final: str) -> bool:
        """Record ``node``'s result: ``out`` renamed to ``final`` when the current
        translation made it, else ``out`` as is (False: the op aliased its input)."""
        renamed = self.rename(out, final)
        self.env[node.name] = final if renamed else out
        return renamed


# -- shape tracing ------------------------------------------------------------------------
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


def trace_shapes(gm: torch.fx.GraphModule, example: torch.Tensor | tuple) -> dict[str, object]:
    """Shapes and dtypes of every node, from two runs with batch B and B+1 (``example``: a
    tuple for a model with several inputs).

    A dim that moves with the batch is written ``"<k>*batch<+c>"`` (torch.export's meta
    shapes are not used: nodes rewritten after export, e.g. eval batch norm, carry the
    pattern's example shapes).
    """
    xs = example if isinstance(example, tuple) else (example,)
    bases = [x.repeat((2,) + (1,) * (x.ndim - 1))[: max(2, len(x))] for x in xs]
    runs = []
    for feed in (bases, [torch.cat([x, x[:1]]) for x in bases]):
        interp = _ShapeRun(gm)
        with torch.no_grad():
            interp.run(*feed)
        runs.append(interp.seen)
    batch = len(bases[0])

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
