"""original: load the user's ONNX float model, check it, give every node its layer id.

What the vendor's ``xxx_original_float_model.onnx`` is: the model with shapes inferred and
its ops and tensors checked, the baseline every later stage is compared with. Here also:
- a file that is not ONNX, truncated or empty is a :class:`StageError` naming the file;
- every op outside :data:`stages.ptq.graph.SUPPORTED_OPS` (or in another domain) is listed
  by op and node in debug/model_check_result.txt, then refused with a StageError naming
  them, before any later stage runs;
- every node gets a canonical layer id in ``metadata_props["qparity.layer_id"]``: the
  module path of torch's scoped names (``/block1/conv1/Conv`` -> ``block1.conv1``,
  ``/layer1/layer1.0/relu_1/Relu`` -> ``layer1.0.relu@1``, the ids the QAT chain gives the
  same modules); from torch's dynamo exporter, the module path of the node's
  ``pkg.torch.onnx.name_scopes`` metadata (``['', 'layer1', 'layer1.0', 'layer1.0.relu',
  'relu_1']`` -> ``layer1.0.relu``, its second call ``layer1.0.relu@1``; a conv the
  exporter's optimizer fused a batch norm into carries the norm's scope); else the node
  name (``<op_type>_<k>`` when it has none), made unique.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import onnx

from schemas.errors import StageError
from stages.ptq.graph import SUPPORTED_OPS, layer_of, set_layer

_HINT = "pass an ONNX model file (a ModelProto saved with onnx.save or torch.onnx.export)"


def load_model(path: Path) -> onnx.ModelProto:
    """Parse ``path`` as ONNX; anything else is a StageError naming the file and the fix."""
    path = Path(path)
    if not path.is_file():
        raise StageError(f"model file {path} does not exist", where=str(path), hint=_HINT)
    data = path.read_bytes()
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf DecodeError and friends: not ONNX or truncated
        raise StageError(
            f"{path} is not a readable ONNX model ({type(e).__name__}; {len(data)} bytes)",
            where=str(path),
            hint=f"the file is truncated or not ONNX: export it again; {_HINT}",
        ) from e
    if not model.graph.node or not model.graph.output:
        raise StageError(
            f"{path} parses but holds no ONNX graph ({len(data)} bytes)",
            where=str(path),
            hint=f"the file is truncated or not ONNX: export it again; {_HINT}",
        )
    return model


def check_model(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """onnx.checker plus strict shape inference; the inferred model (initializers no longer
    listed as graph inputs)."""
    inits = {i.name for i in model.graph.initializer}
    real = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(real)
    try:
        onnx.checker.check_model(model)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise StageError(
            f"the model fails ONNX checks: {str(e)[:300]}",
            where=str(path),
            hint="fix the model (onnx.checker.check_model must pass) and export it again",
        ) from e
    if not real:
        raise StageError(
            "the model has no input",
            where=str(path),
            hint="the PTQ chain feeds every graph input from the dataset: export the "
            "model with its inputs",
        )
    return model


def unsupported(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes whose op the chain cannot model (another domain, or not in SUPPORTED_OPS); a
    ``Shape`` reading the batch size of the input (``Shape(x)[0:1]``, a class token's
    Expand target) is supported: compile runs it on the CPU side."""
    inputs = {i.name for i in model.graph.input}
    return [
        n
        for n in model.graph.node
        if n.domain not in ("", "ai.onnx")
        or (n.op_type not in SUPPORTED_OPS and not batch_size_read(n, inputs))
    ]


def batch_size_read(node: onnx.NodeProto, inputs: set[str]) -> bool:
    """True for ``Shape(x, start=0, end=1)`` of a graph input: the batch size."""
    attrs = {a.name: a.i for a in node.attribute}
    return (
        node.op_type == "Shape"
        and node.input[0] in inputs
        and attrs.get("start", 0) == 0
        and attrs.get("end") == 1
    )


def assign_layer_ids(model: onnx.ModelProto) -> dict[str, str]:
    """Name every node and tag it with a unique layer id; returns node name -> layer id."""
    taken = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    mapping = {}
    for k, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{k}"
    scoped = _dynamo_ids(model.graph.node) or [_scoped_id(n) for n in model.graph.node]
    for node, sid in zip(model.graph.node, _second_calls(scoped), strict=True):
        lid, j = sid, 1
        base = lid
        while lid in taken:
            lid, j = f"{base}_{j}", j + 1
        taken.add(lid)
        set_layer(node, lid)
        mapping[node.name] = lid
    return mapping


def _second_calls(ids: list[str]) -> list[str]:
    """``relu_1`` -> ``relu@1`` where ``relu`` is an id too: the exporter's name for a
    module's second call, written as the QAT chain (torch.export) writes it."""
    known = set(ids)
    out = []
    for i in ids:
        m = re.fullmatch(r"(.+)_(\d+)", i)
        out.append(f"{m.group(1)}@{m.group(2)}" if m and m.group(1) in known else i)
    return out


NAME_SCOPES = "pkg.torch.onnx.name_scopes"
"""The dynamo exporter's metadata: the module scopes of the fx node a node came from."""


def _dynamo_ids(nodes) -> list[str] | None:
    """Ids from the dynamo exporter's name scopes (module docstring): the module path,
    ``<path>_<k>`` for the k-th other call of that module with the same op (made
    ``@k`` by :func:`_second_calls`); None if no node has the metadata."""
    scopes = [_name_scopes(n) for n in nodes]
    if not any(scopes):
        return None
    calls: dict[tuple[str, str], list[str]] = {}
    out = []
    for node, sc in zip(nodes, scopes, strict=True):
        if not sc or len(sc) < 2 or not sc[-2]:
            out.append(node.name)
            continue
        seen = calls.setdefault((sc[-2], node.op_type), [])
        seen += [] if sc[-1] in seen else [sc[-1]]
        k = seen.index(sc[-1])
        out.append(sc[-2] if k == 0 else f"{sc[-2]}_{k}")
    return out


def _name_scopes(node: onnx.NodeProto) -> list[str] | None:
    raw = next((p.value for p in node.metadata_props if p.key == NAME_SCOPES), None)
    try:
        scopes = ast.literal_eval(raw) if raw else None
    except (ValueError, SyntaxError):
        return None
    ok = isinstance(scopes, list) and all(isinstance(s, str) for s in scopes)
    return scopes if ok else None


def _scoped_id(node: onnx.NodeProto) -> str:
    """``/a/b/Conv_3`` -> ``a.b``; other names unchanged.

    torch's TorchScript exporter names a container's child with the container's name in
    front (``/layer1/layer1.0/conv1/Conv``, ``/downsample/downsample.0/Conv``): such a
    part replaces the part it repeats, so the id is the module path the QAT chain uses
    (``layer1.0.conv1``, ``layer2.0.downsample.0``)."""
    if not node.name.startswith("/"):
        return node.name
    parts = [p for p in node.name.split("/") if p]
    if len(parts) > 1 and re.fullmatch(rf"{re.escape(node.op_type)}(_\d+)?", parts[-1]):
        parts = parts[:-1]
    path: list[str] = []
    for part in parts:
        if path and part.startswith(path[-1] + "."):
            path[-1] = part
        else:
            path.append(part)
    return ".".join(path) or node.name


def render_check(model: onnx.ModelProto, path: Path, bad: list[onnx.NodeProto]) -> str:
    """debug/model_check_result.txt of the original stage."""
    out = [f"# model_check_result (PTQ chain: {path.name})", "", "## model"]
    out.append(f"opset {_opset(model)}, ir_version {model.ir_version}, "
               f"producer {model.producer_name or '-'} {model.producer_version}")  # fmt: skip
    out += [f"input {i.name}: {_shape(i)}" for i in model.graph.input]
    out += [f"output {o.name}: {_shape(o)}" for o in model.graph.output]
    out += ["", "## ops found (op_type: count)"]
    counts = Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    out += [f"{op}: {k}" for op, k in sorted(counts.items())]
    out += ["", f"## unsupported ops ({len(bad)})"]
    out += [f"{n.op_type} | node {n.name} | layer {layer_of(n)}" for n in bad] or ["none"]
    if bad:
        out.append(f"supported: {', '.join(sorted(SUPPORTED_OPS))}")
    out += ["", "## layer ids (node name -> layer id)"]
    out += [f"{n.name} -> {layer_of(n)}" for n in model.graph.node]
    return "\n".join(out) + "\n"


def refuse(bad: list[onnx.NodeProto], path: Path) -> StageError:
    """The StageError for unsupported ops: each op type with its nodes."""
    by_op: dict[str, list[str]] = {}
    for n in bad:
        by_op.setdefault(n.op_type, []).append(n.name)
    what = "; ".join(f"{op} (node {', '.join(names)})" for op, names in by_op.items())
    sizes = (
        "; a Shape left is a size computation that follows the batch: set "
        "model.input_shapes with dim 0 (e.g. [1, C, H, W]) and original fixes the batch, "
        "folds it and makes the batch dynamic again"
        if "Shape" in by_op
        else ""
    )
    return StageError(
        f"unsupported ops: {what}",
        where=str(path),
        hint="see debug/model_check_result.txt; replace these ops in the model "
        f"(docs/design.md 'Op coverage') or export it without them{sizes}",
    )


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _shape(v: onnx.ValueInfoProto) -> str:
    dims = [d.dim_param or str(d.dim_value) for d in v.type.tensor_type.shape.dim]
    return f"[{', '.join(dims)}] elem_type {v.type.tensor_type.elem_type}"
