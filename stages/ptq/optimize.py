"""optimized: equivalent rewrites of the float model (the vendor's optimized_float_model).

Passes, in order (each keeps tensor names, so the original and optimized graphs can be
compared tensor by tensor; every removed layer is recorded with what absorbed it):
- opset conversion to :data:`stages.ptq.graph.OPSET` (operator replacement by the ONNX
  version converter; layer ids restored by node name);
- constant folding: ``Constant`` nodes and nodes whose inputs are all constants become
  initializers (evaluated once with the ONNX reference evaluator);
- pattern fusion (:mod:`stages.ptq.patterns`): exporters' decomposed LayerNorm, Erf GELU
  and hardswish idioms become LayerNormalization, Gelu and HardSwish, each instance (and
  each partly matched one, with the node that broke it) in ``patterns``;
- constants second: an ``Add`` or ``Mul`` with a constant first operand and a tensor second
  (torch's TorchScript exporter writes a linear's bias as ``Add(bias, MatMul)``) gets its
  operands swapped, as convert takes a bias or constant only as input 1;
- BN fusion into the conv before it: ``W' = W * g``, ``b' = (b - mean) * g + beta`` with
  ``g = gamma / sqrt(var + eps)`` per output channel; a BN without a conv before it
  becomes ``x * g + (beta - mean * g)`` (Mul and Add by per-channel constants);
- canonical Gemm: ``transB = 0`` with a constant B is transposed, ``alpha``/``beta`` folded
  into the constants (convert takes ``alpha = beta = 1, transB = 1``);
- redundant ops removed: Identity, Dropout, float -> float Cast, a Reshape/Flatten whose
  output shape equals its input shape, a Transpose with the identity permutation;
- floor-mode pools: a MaxPool with ``ceil_mode`` gets end pads grown until floor mode gives
  its inferred output size (``extra = max(0, (o - 1) * s + (k - 1) * d + 1 - (i + pads))``
  per spatial dim; a max ignores the extra cells), as the QAT chain's export writes it:
  the integer QMaxPool has no ceil mode.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from schemas.errors import StageError
from stages.ptq.graph import OPSET, attr, layer_of, producers, rename_input, set_layer, users
from stages.ptq.pattern_match import PatternMatch
from stages.ptq.patterns import fuse_patterns


def optimize(
    model: onnx.ModelProto, patterns: list[PatternMatch] | None = None
) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The optimized model and {removed layer id: what happened to it}; the pattern
    instances found are appended to ``patterns`` when given."""
    model = to_opset(model)
    removed: dict[str, str] = {}
    fold_constants(model, removed)
    constants_second(model)
    found = fuse_patterns(model, removed)
    if patterns is not None:
        patterns.extend(found)
    fuse_batchnorm(model, removed)
    canonical_gemm(model)
    del model.graph.value_info[:]
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    remove_redundant(model, removed)
    floor_mode_pools(model)
    drop_unused_initializers(model)
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), removed


def to_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model at opset OPSET, every node keeping (or getting) its layer id."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version == OPSET:
        return model
    ids = {n.name: layer_of(n) for n in model.graph.node}
    try:
        out = version_converter.convert_version(model, OPSET)
    except Exception as e:  # the converter raises RuntimeError / ConvertError subclasses
        raise StageError(
            f"cannot convert the model from opset {version} to {OPSET}: {str(e)[:200]}",
            where="optimized",
            hint=f"export the model at opset {OPSET} (torch.onnx.export(opset_version=...))",
        ) from e
    for k, node in enumerate(out.graph.node):
        node.name = node.name or f"{node.op_type}_opset{k}"
        set_layer(node, ids.get(node.name, node.name))
    return out


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _set_init(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, name))
            return
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))


def _new_init(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    taken = {i.name for i in model.graph.initializer}
    out, k = name, 1
    while out in taken:
        out, k = f"{name}#{k}", k + 1
    _set_init(model, out, np.asarray(value))
    return out


def fold_constants(model: onnx.ModelProto, removed: dict[str, str]) -> None:
    """Constant-only nodes -> initializers (in graph order, so chains fold in one pass)."""
    from onnx.reference import ReferenceEvaluator

    consts, keep = set(_inits(model)), []
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        ins = [i for i in node.input if i]
        foldable = all(i in consts for i in ins) and not outputs & set(node.output)
        if not foldable or node.domain not in ("", "ai.onnx"):
            keep.append(node)
            continue
        feeds = {i: numpy_helper.to_array(t) for t in model.graph.initializer
                 for i in ins if t.name == i}  # fmt: skip
        one = helper.make_model(
            helper.make_graph(
                [node],
                "fold",
                [],
                [helper.make_value_info(o, onnx.TypeProto()) for o in node.output],
            ),  # fmt: skip
            opset_imports=[helper.make_opsetid("", OPSET)],
        )
        values = ReferenceEvaluator(one).run(None, {k: feeds[k] for k in ins})
        for name, value in zip(node.output, values, strict=True):
            _set_init(model, name, np.asarray(value))
            consts.add(name)
        removed[layer_of(node)] = "constant folded into an initializer"
    del model.graph.node[:]
    model.graph.node.extend(keep)


def constants_second(model: onnx.ModelProto) -> None:
    """``Add(c, x)`` / ``Mul(c, x)`` with constant ``c`` -> ``Add(x, c)`` / ``Mul(x, c)``."""
    inits = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("Add", "Mul") and node.input[0] in inits and node.input[1] not in inits:
            node.input[0], node.input[1] = node.input[1], node.input[0]


def fuse_batchnorm(model: onnx.ModelProto, removed: dict[str, str]) -> None:
    """Fold each BatchNormalization into the conv before it (or into Mul + Add)."""
    inits, made = _inits(model), producers(model.graph)
    for bn in [n for n in model.graph.node if n.op_type == "BatchNormalization"]:
        gamma, beta, mean, var = (inits[i].astype(np.float64) for i in bn.input[1:5])
        g = gamma / np.sqrt(var + attr(bn, "epsilon", 1e-5))
        conv = made.get(bn.input[0])
        if conv is not None and _fusable(model, conv, inits):
            _fold_into_conv(model, conv, bn, g, beta - mean * g, inits)
            removed[layer_of(bn)] = f"BN folded into {layer_of(conv)}"
        else:
            _bn_as_mul_add(model, bn, g, beta - mean * g)
            removed[layer_of(bn)] = "BN replaced by Mul + Add of per-channel constants"


def _fusable(model: onnx.ModelProto, conv: onnx.NodeProto, inits: dict) -> bool:
    return (
        conv.op_type == "Conv"
        and conv.input[1] in inits
        and (len(conv.input) < 3 or not conv.input[2] or conv.input[2] in inits)
        and len(users(model.graph)[conv.output[0]]) == 1
        and conv.output[0] not in {o.name for o in model.graph.output}
    )


def _fold_into_conv(model, conv, bn, g: np.ndarray, shift: np.ndarray, inits) -> None:
    """FORMULA: ``W'[o] = W[o] * g[o]``, ``b'[o] = b[o] * g[o] + shift[o]``."""
    w = inits[conv.input[1]].astype(np.float64)
    b = inits[conv.input[2]] if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[0])
    w_new = (w * g.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32)
    b_new = (b.astype(np.float64) * g + shift).astype(np.float32)
    w_name = _new_init(model, f"{layer_of(conv)}.weight", w_new)
    b_name = _new_init(model, f"{layer_of(conv)}.bias", b_new)
    del conv.input[1:]
    conv.input.extend([w_name, b_name])
    conv.output[0] = bn.output[0]
    model.graph.node.remove(bn)


def _bn_as_mul_add(model, bn, g: np.ndarray, shift: np.ndarray) -> None:
    shape = (-1, 1, 1) if len(_shape_of(model, bn.input[0])) == 4 else (-1,)
    lid = layer_of(bn)
    scale = _new_init(model, f"{lid}.scale", g.astype(np.float32).reshape(shape))
    offset = _new_init(model, f"{lid}.shift", shift.astype(np.float32).reshape(shape))
    mul = helper.make_node("Mul", [bn.input[0], scale], [f"{bn.output[0]}#mul"], name=f"{lid}/mul")
    add = helper.make_node("Add", [mul.output[0], offset], [bn.output[0]], name=bn.name)
    set_layer(mul, f"{lid}.mul")
    set_layer(add, lid)
    k = list(model.graph.node).index(bn)
    model.graph.node.remove(bn)
    model.graph.node.insert(k, add)
    model.graph.node.insert(k, mul)


def canonical_gemm(model: onnx.ModelProto) -> None:
    """Gemm with constant B and C: ``transB = 1``, ``alpha = beta = 1`` (values folded)."""
    inits = _inits(model)
    for node in model.graph.node:
        if node.op_type != "Gemm" or node.input[1] not in inits or attr(node, "transA", 0):
            continue
        w = inits[node.input[1]]
        w = w if attr(node, "transB", 0) else w.T
        w = w * np.float32(attr(node, "alpha", 1.0))
        node.input[1] = _new_init(model, f"{layer_of(node)}.weight", w.astype(np.float32))
        if len(node.input) > 2 and node.input[2] in inits:
            c = inits[node.input[2]] * np.float32(attr(node, "beta", 1.0))
            node.input[2] = _new_init(model, f"{layer_of(node)}.bias", c.astype(np.float32))
        _set_attrs(node, drop=("alpha", "beta"), transB=1)


def floor_mode_pools(model: onnx.ModelProto) -> None:
    """MaxPool ``ceil_mode=1`` -> floor mode with grown end pads (module docstring); needs
    the inferred shapes of its input and output (left alone without them)."""
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}  # fmt: skip
    for node in model.graph.node:
        if node.op_type != "MaxPool" or not attr(node, "ceil_mode", 0):
            continue
        ins, outs = dims.get(node.input[0], [])[2:], dims.get(node.output[0], [])[2:]
        if not ins or not all(ins) or len(outs) != len(ins) or not all(outs):
            continue
        n = len(ins)
        k = list(attr(node, "kernel_shape"))
        s = list(attr(node, "strides", None) or [1] * n)
        d = list(attr(node, "dilations", None) or [1] * n)
        pads = list(attr(node, "pads", None) or [0] * (2 * n))
        for j in range(n):
            need = (outs[j] - 1) * s[j] + (k[j] - 1) * d[j] + 1 - (ins[j] + pads[j] + pads[n + j])
            pads[n + j] += max(0, need)
        _set_attrs(node, ceil_mode=0, pads=pads)


def _set_attrs(node: onnx.NodeProto, drop: tuple[str, ...] = (), **values) -> None:
    """Set attributes ``values`` of ``node`` and remove those named in ``drop``."""
    keep = [a for a in node.attribute if a.name not in values and a.name not in drop]
    del node.attribute[:]
    node.attribute.extend([*keep, *(helper.make_attribute(k, v) for k, v in values.items())])


def remove_redundant(model: onnx.ModelProto, removed: dict[str, str]) -> None:
    """Drop nodes whose output equals their first input (never a graph output)."""
    outputs = {o.name for o in model.graph.output}
    for node in list(model.graph.node):
        why = _redundant(model, node)
        if why is None or node.output[0] in outputs or any(o for o in node.output[1:]
                                                           if users(model.graph).get(o)):  # fmt: skip
            continue
        model.graph.node.remove(node)
        rename_input(model.graph, node.output[0], node.input[0])
        removed[layer_of(node)] = why


def _redundant(model: onnx.ModelProto, node: onnx.NodeProto) -> str | None:
    op = node.op_type
    if op in ("Identity", "Dropout"):
        return f"redundant {op} removed"
    if op == "Cast" and attr(node, "to") == onnx.TensorProto.FLOAT:
        return "float -> float Cast removed" if _elem(model, node.input[0]) == 1 else None
    if op in ("Reshape", "Flatten"):
        a, b = _shape_of(model, node.input[0]), _shape_of(model, node.output[0])
        same = a == b and a is not None and all(isinstance(d, int) or d for d in a)
        return f"no-op {op} removed" if same else None
    if op == "Transpose":
        perm = attr(node, "perm")
        return "identity Transpose removed" if perm and list(perm) == sorted(perm) else None
    return None


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    vis = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    return {v.name: v for v in vis}


def _shape_of(model: onnx.ModelProto, name: str) -> tuple | None:
    v = _value_infos(model).get(name)
    if v is None or not v.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim)


def _elem(model: onnx.ModelProto, name: str) -> int:
    v = _value_infos(model).get(name)
    return v.type.tensor_type.elem_type if v is not None else 0


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
