"""ptq: table ops of the calibrated model become fixed point (the vendor's ptq_model).

A table op (:data:`TABLE_FNS`: Sigmoid, Tanh, Exp, Log, Sqrt, Reciprocal, Erf, Softplus,
HardSigmoid, HardSwish, Gelu, LeakyRelu, Elu) whose input lies on a quantization grid (the DequantizeLinear of an
output quantizer, possibly through passthrough ops that keep the grid) and whose only user
is its output quantizer becomes, exactly as :mod:`stages.onnx_export` writes a fixed-point
op::

    QuantizeLinear(in_scale) [<layer>/q] -> qparity::Lut [<layer>] -> DequantizeLinear(out_scale)
    [<layer>/dq, writing <layer>/raw] -> the layer's output quantizer (unchanged)

Tables (:mod:`simulator.arith.lut`, evaluated by :mod:`simulator.arith.custom_ops`):
- int8 input: one direct 256-entry table,
  ``entries[q + 128] = clamp(round_half_even(f(float32(q * in_scale)) / out_scale))`` with
  ``f`` the float32 torch op, so the table reproduces the calibrated model's fake quant;
- int16 input: a segmented table of the march (6 segments x 64 entries on Nash), linear
  interpolation inside a segment, ``f`` in float64.
Any other table op stays a float op between its quantizers (a float island at convert, a
CPU instruction in the .hbm); each one is listed with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.composite import build_softmax
from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.arith.lut import build_direct_table, build_segmented_table
from simulator.program.march import March
from stages.onnx_builder import DOMAIN, INT_DTYPES
from stages.ptq.graph import PASSTHROUGH_OPS, TABLE_OPS, layer_of, set_layer, users


def _attr(node: onnx.NodeProto, name: str, default):
    found = [helper.get_attribute_value(a) for a in node.attribute if a.name == name]
    return found[0] if found else default


def _hard_sigmoid(node):
    """ONNX HardSigmoid: ``clip(alpha * x + beta, 0, 1)`` (torch's exporter: 1/6, 0.5)."""
    alpha, beta = _attr(node, "alpha", 0.2), _attr(node, "beta", 0.5)
    return lambda x: torch.clamp(alpha * x + beta, 0, 1)


def _gelu(node):
    approximate = _attr(node, "approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return lambda x: torch.nn.functional.gelu(x, approximate=approximate)


TABLE_FNS = {
    "Sigmoid": lambda n: torch.sigmoid,
    "Tanh": lambda n: torch.tanh,
    "Exp": lambda n: torch.exp,
    "Log": lambda n: torch.log,
    "Sqrt": lambda n: torch.sqrt,
    "Reciprocal": lambda n: torch.reciprocal,
    "Erf": lambda n: torch.erf,
    "Softplus": lambda n: torch.nn.functional.softplus,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda n: torch.nn.functional.hardswish,
    "Gelu": _gelu,
    "LeakyRelu": lambda n: lambda x: torch.nn.functional.leaky_relu(x, _attr(n, "alpha", 0.01)),
    "Elu": lambda n: lambda x: torch.nn.functional.elu(x, _attr(n, "alpha", 1.0)),
}
"""node -> the float function of its table op, ONNX attributes applied (the op's lower-case
name labels the table in simulator.arith.lut)."""


def grids(model: onnx.ModelProto) -> dict[str, tuple[float, str]]:
    """Tensor -> (scale, dtype) for activations on a per-tensor grid: DequantizeLinear
    outputs, and what passthrough ops make of them."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out: dict[str, tuple[float, str]] = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and inits[node.input[1]].size == 1:
            out[node.output[0]] = (
                float(inits[node.input[1]].reshape(-1)[0]),
                str(inits[node.input[2]].dtype),
            )
        elif node.op_type in PASSTHROUGH_OPS and node.input[0] in out:
            for o in node.output:
                out[o] = out[node.input[0]]
    return out


def fix_tables(model: onnx.ModelProto, march: March) -> tuple[onnx.ModelProto, list, dict]:
    """(ptq model, layer ids made fixed point, {layer id: why it stays float})."""
    grid, readers, shapes = grids(model), users(model.graph), _shapes(model)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes, fixed, islands = [], [], {}
    for node in model.graph.node:
        if node.op_type not in TABLE_OPS:
            nodes.append(node)
            continue
        lid, q_out = layer_of(node), readers[node.output[0]]
        if node.input[0] not in grid:
            islands[lid] = "input is not on a quantization grid (e.g. an int32 output feeds it)"
        elif len(q_out) != 1 or q_out[0].op_type != "QuantizeLinear":
            islands[lid] = "output has no quantizer of its own"
        else:
            out = (
                float(inits[q_out[0].input[1]].reshape(-1)[0]),
                str(inits[q_out[0].input[2]].dtype),
            )
            payload, kw = _payload(node, grid[node.input[0]], out, march, shapes)
            if payload is not None:
                nodes += _fixed_nodes(model, node, grid[node.input[0]], out, payload, kw)
                fixed.append(lid)
                continue
            islands[lid] = kw
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if all(o.domain != DOMAIN for o in model.opset_import):  # convert writes its ops there
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    onnx.checker.check_model(model)
    return model, fixed, islands


def table_for(node: onnx.NodeProto, src: tuple[float, str], dst: tuple[float, str], march: March):
    """The LutTable of ``node``'s op from input grid ``src`` to output grid ``dst``."""
    (s_in, dt_in), (s_out, dt_out) = src, dst
    op, fn = node.op_type, TABLE_FNS[node.op_type](node)
    if dt_in == "int8":
        qmin, qmax = fp.qrange("int8")
        grid = torch.arange(qmin, qmax + 1, dtype=torch.float32) * torch.tensor(s_in)
        return build_direct_table(op.lower(), fn(grid), s_in, s_out, dt_out, "half_even")

    def f64(x: np.ndarray) -> np.ndarray:
        return fn(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()

    return build_segmented_table(
        op.lower(), f64, s_in, s_out, dt_out, "half_even",
        in_dtype=dt_in, segments=march.lut_segments, entries=march.lut_entries,
    )  # fmt: skip


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor -> its inferred dims (0 where unknown, e.g. the batch)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    return {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*g.input, *g.value_info, *g.output]
    }


def _payload(node, src, dst, march, shapes) -> tuple[object | None, dict | str]:
    """The fixed-point tables of ``node`` and their attributes: a Lut's, or Softmax's
    composite (exp table, reciprocal table, the sum's shift for the softmax axis' length,
    as pre_export builds them for the QAT chain); (None, why) when the softmax stays float:
    its axis length is not static, or its input grid is too coarse for the exp table (a
    score grid step above ``|ln 2^-17| / segments``, e.g. an int8 add of BERT's -10000 mask)."""
    if node.op_type != "Softmax":
        return table_for(node, src, dst, march), {}
    dims = shapes.get(node.input[0], [])
    axis = _attr(node, "axis", -1) % max(len(dims), 1)
    n_max = dims[axis] if axis < len(dims) else 0
    if n_max <= 0:
        return None, "the softmax axis has no static length"
    try:
        return build_softmax(*src, *dst, "half_even", n_max=n_max), {"axis": axis}
    except SimulatorError as e:
        return None, (
            f"input grid {src[1]} scale {src[0]:.4g} too coarse for the exp table ({e.what}); "
            "quantize the tensor feeding it as int16 (quant.overrides) to make it fixed point"
        )


def _fixed_nodes(model, node, src, dst, payload, kw) -> list[onnx.NodeProto]:
    """Q(in) -> qparity::Lut (or Softmax) -> DQ(out) replacing ``node`` (its output name
    kept)."""
    lid = layer_of(node)
    op = "Softmax" if node.op_type == "Softmax" else "Lut"
    attrs, tables = CUSTOM_OPS[op].encode(payload, **kw)
    names = [_const(model, f"{lid}/{k}", v) for k, v in tables.items()]
    s_in, zp_in = _qparams(model, f"{lid}/in", *src)
    s_out, zp_out = _qparams(model, f"{lid}/out", *dst)
    q = helper.make_node("QuantizeLinear", [node.input[0], s_in, zp_in], [f"{lid}/q:0"],
                         name=f"{lid}/q")  # fmt: skip
    lut = helper.make_node(op, [q.output[0], *names], [f"{lid}:0"], name=lid, domain=DOMAIN,
                           **attrs)  # fmt: skip
    dq = helper.make_node("DequantizeLinear", [lut.output[0], s_out, zp_out], [node.output[0]],
                          name=f"{lid}/dq")  # fmt: skip
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(INT_DTYPES[dst[1]]))
    model.graph.value_info.append(helper.make_tensor_value_info(lut.output[0], elem, None))
    for n in (q, lut, dq):
        set_layer(n, lid)
    return [q, lut, dq]


def _qparams(model, tag: str, scale: float, dtype: str) -> tuple[str, str]:
    s = _const(model, f"{tag}/scale", np.asarray(scale, np.float32))
    return s, _const(model, f"{tag}/zero_point", np.zeros((), INT_DTYPES[dtype]))


def _const(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def render_tables(fixed: list[str], islands: dict[str, str]) -> list[str]:
    """The ptq section of model_check_result.txt."""
    out = ["", f"## ptq: table ops made fixed point ({len(fixed)})"]
    out += fixed or ["none"]
    out += ["", f"## ptq: table ops left in float (float islands) ({len(islands)})"]
    out += [f"{k} | {v}" for k, v in islands.items()] or ["none"]
    return out
