"""Find the table ops of a QAT graph, build their fixed-point tables, rewrite the graph.

A table op (sigmoid, exp, gelu..., softmax, layer_norm) can become fixed point when its
input comes from a quantizer (through passthrough ops, which keep the grid) and its only
user is its output quantizer: the table maps input integers (``in_scale``, ``in_dtype``)
to output integers (``out_scale``, ``out_dtype``). int8 inputs get one direct 256-entry
table computed with the QAT graph's own torch op on the 256 grid values, so the table
reproduces fake quant exactly; int16 inputs get a segmented table with interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.fx

from schemas.errors import StageError
from simulator.arith import fixedpoint
from simulator.arith.composite import EXP_CUTOFF, build_layernorm, build_softmax
from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.arith.lut import build_direct_table, build_segmented_table
from stages.fake_quant import QFakeQuantize
from stages.fixed_ops import FixedPointOp
from stages.layers import ID_KEY, Category, classify
from stages.modelio import attr_tensor
from stages.ops import TABLE_OPS


@dataclass(frozen=True)
class TableSettings:
    """Shapes of int16-input tables (spec ``stages.pre_export``)."""

    segments: int = 6
    entries: int = 64
    dividing: str = "even"


@dataclass(frozen=True)
class Candidate:
    """A table op with the quantizers around it."""

    node: torch.fx.Node
    op_type: str
    in_fq: QFakeQuantize
    out_fq: QFakeQuantize

    @property
    def layer_id(self) -> str:
        return self.node.meta[ID_KEY]


def find_candidates(
    gm: torch.fx.GraphModule, subtree: list[str]
) -> tuple[list[Candidate], dict[str, str]]:
    """Table ops that can become fixed point, and the others with the reason why not."""
    found, skipped = [], {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or ID_KEY not in node.meta:
            continue
        op_type, cat = classify(node)
        if cat not in (Category.LUT, Category.COMPOSITE):
            continue
        lid = node.meta[ID_KEY]
        reason = _why_not(gm, node, op_type, lid, subtree)
        if reason:
            skipped[lid] = reason
        else:
            found.append(Candidate(node, op_type, _input_fq(gm, node), _output_fq(gm, node)))
    return found, skipped


def _why_not(gm, node, op_type, lid, subtree) -> str | None:
    if subtree and not any(lid == p or lid.startswith(p + ".") for p in subtree):
        return "outside stages.pre_export.subtree: kept as float op with fake quant"
    if op_type == "attention":
        return "scaled_dot_product_attention has no BPU table form: write matmul + softmax"
    if _input_fq(gm, node) is None:
        return "input is not quantized (e.g. a high-precision output feeds it): no table"
    if _output_fq(gm, node) is None:
        return "output is not quantized by its own quantizer: no table"
    return None


def _fq_module(gm, node) -> QFakeQuantize | None:
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        if isinstance(mod, QFakeQuantize):
            return mod
    return None


def _input_fq(gm, node) -> QFakeQuantize | None:
    src = node.args[0] if node.args else None
    while isinstance(src, torch.fx.Node):
        fq = _fq_module(gm, src)
        if fq is not None:
            return fq
        if src.op != "call_function" or classify(src)[1] is not Category.PASSTHROUGH:
            return None
        src = src.args[0]
    return None


def _output_fq(gm, node) -> QFakeQuantize | None:
    users = list(node.users)
    return _fq_module(gm, users[0]) if len(users) == 1 else None


def build_op(gm, c: Candidate, settings: TableSettings) -> tuple[FixedPointOp, object]:
    """The fixed-point module of one candidate, and the table object it encodes."""
    in_scale, out_scale = _scalar_scale(c.in_fq, c), _scalar_scale(c.out_fq, c)
    in_dt, out_dt, rounding = _dt(c.in_fq), _dt(c.out_fq), c.out_fq.rounding
    kw = {}
    if c.op_type == "softmax":
        check_softmax_input(c, in_scale, in_dt)
        kw["axis"] = int(c.node.args[1]) % c.node.meta["val"].dim()
        payload = build_softmax(
            in_scale,
            in_dt,
            out_scale,
            out_dt,
            rounding,
            n_max=int(c.node.meta["val"].shape[kw["axis"]]),
        )
    elif c.op_type == "layer_norm":
        payload = _layernorm_tables(gm, c, in_scale, in_dt, out_scale, out_dt, rounding)
    else:
        payload = _lut_table(c, in_scale, in_dt, out_scale, out_dt, rounding, settings)
    onnx_op = TABLE_OPS[c.op_type]
    attrs, inits = CUSTOM_OPS[onnx_op].encode(payload, **kw)
    op = FixedPointOp(c.layer_id, onnx_op, attrs, inits, in_scale, in_dt, out_scale, out_dt)
    return op, payload


def check_softmax_input(c: Candidate, in_scale: float, in_dt: str) -> None:
    """Refuse a softmax whose input step is too coarse for its exp to tell two scores
    apart (the exp table spans ``[EXP_CUTOFF, 0]``, about 11.8): every score would round
    to the same integer. An additive attention mask (``(1 - mask) * -1e4``, finfo.min)
    calibrates the input range to the mask's constant; the error names the layer feeding
    the softmax and what to do."""
    if abs(EXP_CUTOFF) / in_scale >= 2:
        return
    src = c.node.args[0]
    while isinstance(src, torch.fx.Node) and src.op == "call_module" and src.args:
        src = src.args[0]  # through the quantizer to the op it quantizes
    producer = src.meta.get(ID_KEY, src.name) if isinstance(src, torch.fx.Node) else "its input"
    lo, hi = fixedpoint.qrange(in_dt)
    raise StageError(
        f"the input of softmax {c.layer_id} (from {producer}) is quantized {in_dt} with step "
        f"{in_scale:.3g} (range [{lo * in_scale:.3g}, {hi * in_scale:.3g}]): coarser than the "
        f"{abs(EXP_CUTOFF):.1f} wide range its exp resolves, so every score rounds alike. "
        "A large-negative additive mask ((1 - mask) * -1e4) usually sets that range",
        where=f"pre_export, layer {c.layer_id}",
        hint=f"quantize the scores as int16 (quant.overrides: {{{producer}: int16, "
        f"{c.layer_id}: int16}}), or write the mask with a small constant (e.g. -30: exp "
        "already gives 0 there)",
    )


def torch_fn(node: torch.fx.Node):
    """The node's own torch op as a float64 numpy function of its first input."""

    def fn(x: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.asarray(x, dtype=np.float32))
        return node.target(t, *node.args[1:], **node.kwargs).double().numpy()

    return fn


def _lut_table(c, in_scale, in_dt, out_scale, out_dt, rounding, settings):
    if in_dt == "int8":
        qmin, qmax = fixedpoint.qrange("int8")
        grid = torch.arange(qmin, qmax + 1, dtype=torch.float32) * c.in_fq.scale
        values = c.node.target(grid, *c.node.args[1:], **c.node.kwargs).detach().numpy()
        return build_direct_table(c.op_type, values, in_scale, out_scale, out_dt, rounding)
    return build_segmented_table(
        c.op_type,
        torch_fn(c.node),
        in_scale,
        out_scale,
        out_dt,
        rounding,
        segments=settings.segments,
        entries=settings.entries,
        dividing=settings.dividing,
    )


def _layernorm_tables(gm, c, in_scale, in_dt, out_scale, out_dt, rounding):
    _, shape, weight, bias, eps = (list(c.node.args) + [None, None, 1e-5])[:5]
    if len(shape) != 1:
        raise StageError(
            f"layer_norm over {len(shape)} axes",
            where=c.layer_id,
            hint="normalize over the last axis only (nn.LayerNorm(D))",
        )
    return build_layernorm(
        in_scale,
        in_dt,
        out_scale,
        out_dt,
        rounding,
        n=int(shape[0]),
        eps=float(eps),
        weight=_const(gm, weight),
        bias=_const(gm, bias),
    )


def _const(gm, node) -> np.ndarray | None:
    if node is None:
        return None
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        raise StageError(
            "layer_norm weight/bias is not a constant of the model",
            where=str(node),
            hint="use nn.LayerNorm's own weight and bias",
        )
    return attr_tensor(gm, node.target).detach().double().numpy()


def _scalar_scale(fq: QFakeQuantize, c: Candidate) -> float:
    if fq.scale.numel() != 1 or not fq.is_frozen:
        raise StageError(
            "quantizer around a table op is not a frozen per-tensor scale",
            where=c.layer_id,
            hint="calibrate before pre_export",
        )
    return float(fq.scale)


def _dt(fq: QFakeQuantize) -> str:
    return str(fq.dtype).removeprefix("torch.")


def rewrite(gm: torch.fx.GraphModule, ops: dict[str, FixedPointOp]) -> list[str]:
    """Replace every node whose layer id has a fixed-point op; returns the ids replaced."""
    done = []
    for node in list(gm.graph.nodes):
        lid = node.meta.get(ID_KEY) if node.op == "call_function" else None
        if lid not in ops:
            continue
        name = f"fxp_{len(done)}"
        gm.add_submodule(name, ops[lid])
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(name, (node.args[0],))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done.append(lid)
    gm.graph.lint()
    gm.recompile()
    return done
