"""Run an exported ONNX graph on a batch and capture layer tensors by canonical id.

Backends: onnxruntime when every node is a standard op (BASIC graph optimization only:
higher levels rejected a transformer at opset 21, docs/environment.md "ONNX"); otherwise
``onnx.reference.ReferenceEvaluator`` with the ``qparity`` domain ops of
:mod:`simulator.arith.custom_ops` plugged in as ``new_ops``, plus the memory-bounded Conv and
the run that keeps only the asked tensors (:mod:`stages.onnx_ref_ops`). Layers are captured
by tensor name: export names each layer's final float tensor exactly its layer id.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from schemas.errors import StageError
from stages.onnx_ref_ops import Conv, run_kept

DOMAIN = "qparity"
THREADS = 2
DISABLED_OPTIMIZERS = ["WeightBiasQuantization"]
CUT_RUNNERS = 1
"""Runners of cut graphs (:meth:`OnnxRunner.with_inputs`) a runner keeps: each holds its
own copy of the weights (an onnxruntime session of ResNet-50's qat.onnx cut at every
layer: about 370 MB), and the analysis asks for one cut at a time (own errors: every
layer's; sensitivity: one candidate's, over all its samples)."""
"""onnxruntime's BASIC level rewrites a float conv/linear bias between Q/DQ weights and
activations into int32 at ``s_in * s_w`` (measured: 1.5e-5 off torch on one conv, flipping
output quantization steps). Torch fake quant keeps the bias float, so export must too; the
int32 bias belongs to the convert stage."""


class OnnxRunner:
    """One ONNX model, ready to run: ``run(x)`` and ``run_capture(x, layer_ids)``."""

    def __init__(self, model_or_path: onnx.ModelProto | str | Path):
        self.model = _load(model_or_path)
        self.source = (
            str(model_or_path)
            if not isinstance(model_or_path, onnx.ModelProto)
            else (self.model.graph.name or "ONNX model")
        )
        custom = any(n.domain == DOMAIN for n in self.model.graph.node)
        self.backend = "reference" if custom else "onnxruntime"
        self.input_name = self.model.graph.input[0].name
        self.output_names = [o.name for o in self.model.graph.output]
        self.tensor_names = {t for n in self.model.graph.node for t in n.output}
        self._sessions: dict[tuple[str, ...], object] = {}

    def run(self, x: np.ndarray | tuple[np.ndarray, ...] | dict) -> list[np.ndarray]:
        """The graph outputs for input ``x`` (a tuple: the graph's inputs in order; a dict:
        by input name)."""
        outputs, _ = self.run_capture(x, [])
        return outputs

    def run_capture(
        self, x, layer_ids: list[str], feeds: dict[str, np.ndarray] | None = None
    ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """(outputs, {layer id: tensor}) for the tensors named by ``layer_ids``; ``x`` as
        :meth:`run` takes it.

        ``feeds`` gives extra graph inputs (the cut tensors of :meth:`with_inputs`)."""
        missing = [i for i in layer_ids if i not in self.tensor_names]
        if missing:
            raise StageError(
                f"no tensor named {missing[:5]} in the graph",
                where="onnx runner",
                hint="capture ids of ExportResult.layer_ids whose layer has one output",
            )
        extra = [i for i in layer_ids if i not in self.output_names]
        if not isinstance(x, dict):
            xs = x if isinstance(x, tuple) else (x,)
            x = dict(zip([i.name for i in self.model.graph.input[: len(xs)]], xs, strict=True))
        feeds = {**{n: np.ascontiguousarray(v) for n, v in x.items()}, **(feeds or {})}
        try:
            named = self._named(feeds, extra)
        except StageError:
            raise
        except Exception as e:  # ORT and the reference evaluator raise many types
            raise StageError(
                f"the graph failed to run on {self.backend} ({type(e).__name__}: {str(e)[:300]})",
                where=self.source,
                hint="the model is inconsistent (shapes, types or a missing input): "
                "re-create it with the stage that wrote it",
            ) from e
        outputs = [named[n] for n in self.output_names]
        return outputs, {i: named[i] for i in layer_ids}

    def with_inputs(self, names: tuple[str, ...]) -> OnnxRunner:
        """A runner of this graph where the tensors ``names`` are fed, not computed.

        Each such tensor becomes a graph input read by its consumers; what its producer
        computed stays available as ``<name>#computed``, so one run gives, for every fed
        tensor, what its node made of the fed inputs (own error), while everything
        downstream runs on the fed values (substitution). Cached per set of names.
        """
        key = ("cut", *sorted(names))
        if key not in self._sessions:
            cuts = [k for k in self._sessions if k[:1] == ("cut",)]
            for k in cuts[: max(0, len(cuts) - CUT_RUNNERS + 1)]:  # oldest first
                del self._sessions[k]
            self._sessions[key] = OnnxRunner(_cut(self.model, set(names)))
        return self._sessions[key]

    def forget_cuts(self) -> None:
        """Drop the runners of cut graphs :meth:`with_inputs` keeps (their sessions and
        weights); the next :meth:`with_inputs` builds its runner again."""
        for k in [k for k in self._sessions if k[:1] == ("cut",)]:
            del self._sessions[k]

    def _named(self, feeds: dict, extra: list[str]) -> dict[str, np.ndarray]:
        if self.backend == "onnxruntime":
            values = self._ort(tuple(extra)).run(None, feeds)
            return dict(zip(self.output_names + extra, values, strict=True))
        keep = self.output_names + extra
        n = {len(v) if np.ndim(v) else 0 for v in feeds.values()}
        if len(n) != 1 or n.pop() <= REF_CHUNK:
            return run_kept(self._reference(), feeds, keep)
        return _chunked(self._reference(), feeds, keep)

    def _ort(self, extra: tuple[str, ...]):
        """An onnxruntime session whose outputs also include ``extra`` tensors (cached)."""
        if extra not in self._sessions:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            opts.intra_op_num_threads = opts.inter_op_num_threads = THREADS
            # idle ORT threads otherwise spin after each run and starve the numpy work
            # between runs (analysis: about 3x slower, bench/capture.py)
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            # the arena keeps a run's peak (every captured layer of the batch) for the
            # session's life; analysis holds many sessions (8 GB at 224x224 MobileNetV2)
            opts.enable_cpu_mem_arena = False
            model = _with_outputs(self.model, extra)
            self._sessions[extra] = ort.InferenceSession(
                model.SerializeToString(),
                opts,
                providers=["CPUExecutionProvider"],
                disabled_optimizers=DISABLED_OPTIMIZERS,
            )
        return self._sessions[extra]

    def _reference(self):
        if "ref" not in self._sessions:
            from onnx.reference import ReferenceEvaluator

            types = {
                v.name: helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
                for v in self.model.graph.value_info
                if v.type.tensor_type.elem_type
            }
            ops = [*custom_op_classes(types), Conv]  # Conv: bounded memory at real size
            self._sessions["ref"] = ReferenceEvaluator(self.model, new_ops=ops)
        return self._sessions["ref"]


REF_CHUNK = 4
"""Samples per reference-evaluator run: numpy's temporaries of a bigger batch at 224x224
(hundreds of MB each, fresh pages every time) made a frame 3-6x slower."""


def _chunked(evaluator, feeds: dict, keep: list[str]) -> dict[str, np.ndarray]:
    """:func:`run_kept` on :data:`REF_CHUNK` samples at a time (samples are independent in
    every graph the chain runs), joined along the batch; a tensor without the batch axis
    (a reshaped parameter: the same for every chunk) is taken from the first chunk."""
    n = len(next(iter(feeds.values())))
    starts = range(0, n, REF_CHUNK)
    parts = [run_kept(evaluator, {k: v[a : a + REF_CHUNK] for k, v in feeds.items()}, keep)
             for a in starts]  # fmt: skip
    sizes = [min(REF_CHUNK, n - a) for a in starts]
    out = {}
    for name in keep:
        values = [p[name] for p in parts]
        batched = all(np.ndim(v) and len(v) == k for v, k in zip(values, sizes, strict=True))
        out[name] = np.concatenate(values) if batched else values[0]
    return out


def _load(model_or_path) -> onnx.ModelProto:
    """A ModelProto as is, or loaded from a file; a bad file is a StageError naming it."""
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    path = Path(model_or_path)
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except (OSError, onnx.checker.ValidationError, ValueError) as e:
        raise StageError(
            f"cannot load ONNX model {path}: {type(e).__name__}: {str(e)[:200]}",
            where=str(path),
            hint="the file is missing, truncated or not ONNX; re-run the export stage",
        ) from e
    except Exception as e:  # protobuf DecodeError and friends: a corrupt file
        raise StageError(
            f"cannot parse ONNX model {path} ({type(e).__name__})",
            where=str(path),
            hint="the file is truncated or not ONNX; re-run the export stage",
        ) from e
    if not model.graph.node:
        raise StageError(f"{path} holds no ONNX graph", where=str(path), hint="re-export it")
    return model


COMPUTED = "#computed"


def _cut(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """A copy of ``model`` where each tensor of ``names`` is a graph input and its producer
    writes ``<name>#computed`` instead (see :meth:`OnnxRunner.with_inputs`)."""
    model = copy.deepcopy(model)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    known = {**inferred, **{v.name: v for v in model.graph.value_info}}
    for node in model.graph.node:
        for i, out in enumerate(node.output):
            if out in names:
                node.output[i] = out + COMPUTED
    for name in sorted(names):
        vi = known.get(name)
        vi = vi or helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        model.graph.input.append(copy.deepcopy(vi))
        if name in known:
            computed = copy.deepcopy(known[name])
            computed.name = name + COMPUTED
            model.graph.value_info.append(computed)
    return model


def _with_outputs(model: onnx.ModelProto, names: tuple[str, ...]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph also outputs ``names`` (types from shape inference)."""
    if not names:
        return model
    model = copy.deepcopy(model)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v for v in inferred.graph.value_info}
    for name in names:
        vi = types.get(name) or helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        model.graph.output.append(copy.deepcopy(vi))
    return model


def custom_op_classes(out_types: dict[str, np.dtype] | None = None) -> list[type]:
    """OpRun classes of the qparity domain, one per :data:`simulator.arith.custom_ops.CUSTOM_OPS`.

    ``out_types`` (tensor name -> dtype, from the graph's ``value_info``) casts a custom
    op's integer result to its declared type, so a following DequantizeLinear sees the
    zero point's type; a value outside that type's range is an error, never wrapped.
    """
    from onnx.reference.op_run import OpRun

    from simulator.arith.custom_ops import CUSTOM_OPS

    types = out_types or {}

    def make(op_type: str, op) -> type:
        def _run(self, *inputs, **attrs):
            out = np.asarray(op.evaluate(list(inputs), attrs))
            dtype = types.get(self.onnx_node.output[0])
            return (out if dtype is None else _cast(out, dtype, self.onnx_node),)

        return type(op_type, (OpRun,), {"op_domain": DOMAIN, "_run": _run})

    return [make(name, op) for name, op in CUSTOM_OPS.items()] + [_saturating_quantize()]


SATURATE_STEPS = 2.0**24
"""Inputs beyond this many steps of the smallest scale are clipped before QuantizeLinear
divides: past the int16 range, and ``rint`` of the quotient still fits int32."""


def _saturating_quantize() -> type:
    """Standard QuantizeLinear (any opset) whose non-finite inputs saturate as the board's
    QUANTIZE does (:func:`simulator.arith.fixedpoint.quantize`): ``+inf`` -> qmax, ``-inf``
    and NaN -> qmin. onnx's own casts ``rint(inf)`` to int32, which on x86 is INT_MIN, so a
    float island's ``x / 0`` would quantize to qmin in the reference and qmax on the board."""
    from onnx.reference.ops.op_quantize_linear import _CommonQuantizeLinear

    def _run(self, x, y_scale, zero_point=None, **attrs):
        x = np.asarray(x)
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            bound = SATURATE_STEPS * float(np.min(np.abs(y_scale)))
            x = np.clip(np.nan_to_num(x, nan=-np.inf), -bound, bound).astype(x.dtype)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        return _CommonQuantizeLinear._run(self, x, y_scale, zero_point, **attrs)

    return type("QuantizeLinear", (_CommonQuantizeLinear,), {"op_domain": "", "_run": _run})


def _cast(out: np.ndarray, dtype: np.dtype, node: onnx.NodeProto) -> np.ndarray:
    info = np.iinfo(dtype)
    if out.size and (out.min() < info.min or out.max() > info.max):
        raise StageError(
            f"custom op {node.op_type} produced values in [{out.min()}, {out.max()}], "
            f"outside its declared {np.dtype(dtype).name}",
            where=f"onnx node {node.name}",
            hint="the custom op must saturate to its output dtype",
        )
    return out.astype(dtype)
