"""Per-tensor agreement of a float ONNX model and its QDQ model, streamed batch by batch.

The tensor pairs follow onnxruntime's own rule (``qdq_loss_debug.create_activation_matching``)
over the float tensors its ``modify_model_output_intermediate_tensors`` would save (float or
float16 node inputs and outputs that are not initializers). For an activation ``T`` of the
float model, the QDQ model holds ``pre`` (what its producer computed, before QuantizeLinear)
and ``post`` (after DequantizeLinear), named by the quantizer's suffixes:

- ``T_DequantizeLinear_Output`` (or ``..._Output_1``) is ``post`` and ``T`` is ``pre``;
- ``T_QuantizeLinear_Input`` is ``pre`` and ``T`` is ``post`` (a quantized graph output).

Two comparisons per pair, each with the metrics of :mod:`analysis.metrics` aggregated over
every sample (running sums, so memory holds one batch, never the dataset):

- ``xmodel``: the float model's ``T`` against the QDQ model's ``post`` (ORT's xmodel_err);
- ``qdq``: the QDQ model's ``pre`` against its ``post`` (ORT's qdq_err).

ORT's SQNR is ``20 log10(max(|a|, eps) / max(|a - b|, eps))`` over all samples concatenated;
:meth:`TensorAgreement.sqnr_clamped` gives the same quantity from our sums (``sqnr_db``
itself is +inf where the two sides are identical).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from analysis.metrics import Accumulator, step_of, sums
from stages.onnx_runner import OnnxRunner

QUANT_INPUT = "_QuantizeLinear_Input"
DEQUANT_OUTPUT = "_DequantizeLinear_Output"
DEQUANT_OUTPUT_1 = DEQUANT_OUTPUT + "_1"
SAVED_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)
EPS = float(np.finfo(float).eps)
"""onnxruntime's floor on both norms of its SQNR."""
CHUNK = 32768
"""Elements per :func:`analysis.metrics.sums` call: its float64 temporaries then stay at
128 KB (glibc's mmap threshold, about L2). Whole batches of 100 x 1024 were measured 1.3-1.8x
slower (page faults on every fresh temporary); the aggregates are the same either way."""


@dataclass(frozen=True)
class TensorPair:
    """One activation ``name``: the QDQ model's tensors before Q (``pre``) and after DQ
    (``post``); ``in_float`` when the float model has ``name``; ``step`` the DQ scale."""

    name: str
    pre: str
    post: str
    in_float: bool
    step: float | None = None


@dataclass(frozen=True)
class TensorAgreement:
    """Aggregate metrics of one pair over every sample: ``xmodel`` (float vs QDQ ``post``,
    empty when the float model lacks the tensor) and ``qdq`` (QDQ ``pre`` vs ``post``)."""

    name: str
    xmodel: dict[str, float]
    qdq: dict[str, float]
    totals: dict[str, dict[str, float]] = field(repr=False, default_factory=dict)

    @property
    def sqnr_db(self) -> float:
        return self.xmodel.get("sqnr_db", float("nan"))

    @property
    def qdq_sqnr_db(self) -> float:
        return self.qdq["sqnr_db"]

    def sqnr_clamped(self, kind: str = "xmodel") -> float:
        """SQNR (dB) with onnxruntime's eps floor on both norms: finite where sides match."""
        t = self.totals[kind]
        signal, noise = max(np.sqrt(t["aa"]), EPS), max(np.sqrt(t["d2"]), EPS)
        return float(20 * np.log10(signal / noise))


def saved_tensors(model: onnx.ModelProto) -> set[str]:
    """The tensors onnxruntime's debugger saves: float/float16 node inputs and outputs
    with a known type that are not initializers (``CalibraterBase`` rule)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type for v in [*g.value_info, *g.output, *g.input]}
    inits = {i.name for i in g.initializer}
    names = {t for n in g.node for t in [*n.input, *n.output] if t and t not in inits}
    return {
        t
        for t in names
        if t in types
        and types[t].HasField("tensor_type")
        and types[t].tensor_type.elem_type in SAVED_TYPES
    }


def match_pairs(float_model: onnx.ModelProto, qdq_model: onnx.ModelProto) -> list[TensorPair]:
    """The activation pairs of onnxruntime's ``create_activation_matching``, in the QDQ
    graph's node order, each with its DequantizeLinear scale when that is per tensor."""
    saved, in_float = saved_tensors(qdq_model), saved_tensors(float_model)
    scales = _dq_scales(qdq_model)
    order = [t for n in qdq_model.graph.node for t in [*n.input, *n.output]]
    order = list(dict.fromkeys(t for t in order if t in saved))
    pairs: dict[str, TensorPair] = {}
    for t in order:
        for suffix, t_is_pre in ((QUANT_INPUT, True), (DEQUANT_OUTPUT, False),
                                 (DEQUANT_OUTPUT_1, False)):  # fmt: skip
            if not t.endswith(suffix):
                continue
            name = t[: -len(suffix)]
            pre, post = (t, name) if t_is_pre else (name, t)
            if pre in saved and post in saved:
                pairs[name] = TensorPair(name, pre, post, name in in_float, scales.get(post))
    return list(pairs.values())


def _dq_scales(model: onnx.ModelProto) -> dict[str, float]:
    """DequantizeLinear output -> its scale, where the scale is one constant number."""
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[1] in inits:
            scale = numpy_helper.to_array(inits[n.input[1]])
            if scale.size == 1:
                out[n.output[0]] = float(scale.reshape(()))
    return out


def compare_onnx_pair(
    float_path: str | Path,
    qdq_path: str | Path,
    pairs: list[TensorPair],
    batches: Iterable[np.ndarray],
) -> dict[str, TensorAgreement]:
    """Run both models on every batch, compare each pair, keep only running sums.

    Each model runs once per batch (onnxruntime through :class:`OnnxRunner`, the pairs'
    tensors added as outputs); the input tensor itself is taken from the batch."""
    f_run, q_run = OnnxRunner(float_path), OnnxRunner(qdq_path)
    f_names = [p.name for p in pairs if p.in_float]
    q_names = list(dict.fromkeys(t for p in pairs for t in (p.pre, p.post)))
    acc = {(p.name, k): Accumulator() for p in pairs for k in ("xmodel", "qdq")}
    steps: dict[str, float] = {}
    for x in batches:
        f = _capture(f_run, x, f_names)
        q = _capture(q_run, x, q_names)
        for p in pairs:
            if p.name not in steps:  # the DQ scale, else the int8 step of the first batch
                steps[p.name] = p.step or step_of(None, q[p.pre])
            step = steps[p.name]
            _fold(acc[p.name, "qdq"], q[p.pre], q[p.post], step)
            if p.in_float:
                _fold(acc[p.name, "xmodel"], f[p.name], q[p.post], step)
    return {p.name: _agreement(p, acc, steps) for p in pairs}


def _fold(acc: Accumulator, a: np.ndarray, b: np.ndarray, step: float) -> None:
    """Add the per-sample :func:`sums` of ``a`` vs ``b`` (one batch) to ``acc``, computed
    :data:`CHUNK` elements at a time and joined, so ``acc`` sees the batch in one call."""
    rows = max(1, CHUNK // max(a[:1].size, 1))
    if rows >= len(a):
        acc.add(sums(a, b, step))
        return
    parts = [sums(a[i : i + rows], b[i : i + rows], step) for i in range(0, len(a), rows)]
    acc.add({k: np.concatenate([s[k] for s in parts]) for k in parts[0]})


def _capture(runner: OnnxRunner, x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """``names`` of one run of ``runner`` on ``x``; the graph input is ``x`` itself."""
    inner = [n for n in names if n != runner.input_name]
    _, got = runner.run_capture(x, inner)
    return {**got, runner.input_name: x} if runner.input_name in names else got


def _agreement(p: TensorPair, acc: dict, steps: dict[str, float]) -> TensorAgreement:
    kinds = ("xmodel", "qdq") if p.in_float else ("qdq",)
    res = {k: acc[p.name, k].result(steps[p.name]) for k in kinds}
    totals = {k: dict(acc[p.name, k].totals) for k in kinds}
    return TensorAgreement(p.name, res.get("xmodel", {}), res["qdq"], totals)
