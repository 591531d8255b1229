"""Localization of a PTQ run: the QAT chain's analysis on optimized -> calibrated -> ptq ->
quantized -> hbm -> board. optimized -> calibrated is the quantization loss (the float ONNX
against the QDQ model that quantizes it, layer ids alike), judged like the QAT chain's
float -> calibrate pair (analysis.localize); the later stages are also compared against
calibrated, the chain's first quantized model.

original -> optimized is checked by the optimized stage itself (every layer's cosine
against the original >= the spec's bound, debug/optimize_equivalence.txt): BN folding
changes which tensor a layer id names there, so the pair is not compared here. The
analysis reads the run's PTQ spec (spec.yaml) for the data and batch size, the judged
output and the primary metric (``compare.primary``: a task metric's name with
``data.metric``) and uses the default compare thresholds of a pipeline spec.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from types import SimpleNamespace

import onnx

from analysis.analyze import Analysis, analyze_models
from analysis.layer_graph import Layer
from schemas.errors import QueryError
from schemas.store import Run
from stages.data import Split, load_splits
from stages.ptq import feeds, runners
from stages.ptq.context import PtqModel
from stages.ptq.graph import layer_of

CHAIN = ("optimized", "calibrated", "ptq", "quantized", "hbm", "board")
LOADERS = {
    "optimized": runners.qdq_model,  # a float graph: the layer's last node holds its value
    "calibrated": runners.qdq_model,
    "ptq": runners.qdq_model,
    "quantized": runners.integer_model,
    "hbm": runners.hbm_model,
}


@dataclass
class PtqAnalysisContext:
    """What analysis.analyze_models reads, for a PTQ run."""

    run: Run
    evaluation: Split
    spec: SimpleNamespace

    def write_debug(self, name: str, text: str) -> None:
        self.run.write_debug(name, text)


def is_ptq_run(run: Run) -> bool:
    return "calibrated" in run.manifest().stages


def analyze_ptq(run: Run, spec) -> Analysis:
    """Compare, bad cases, localization of a PTQ run (``spec``: its PtqSpec)."""
    done = _done(run)
    if len(done) < 2:
        raise QueryError(
            f"PTQ run {run.run_id} has {len(done)} comparable stage(s)",
            where="localize",
            hint="run the PTQ chain at least to ptq",
        )
    evaluation = _evaluation(spec, run)
    ctx = PtqAnalysisContext(run, evaluation, _spec(spec))
    arts = {s: run.load_artifact(s, PtqModel) for s in done}
    graph = next(s for s in ("calibrated", *done) if s in arts)  # the QDQ graph's layers
    calibrated = onnx.load(str(run.path(arts[graph].onnx_file)))
    layers = layer_graph(calibrated)
    flops = functools.partial(onnx_flops, calibrated, layers)
    models = ptq_models(run, spec, evaluation)
    return analyze_models(ctx, done, models, layers, _integer(run, arts), flops)


def ptq_models(run: Run, spec, evaluation: Split | None = None) -> dict:
    """The complete comparable stages' models, each fed every evaluation input by name and
    comparing the judged output (``compare.output``, ids of the original model's outputs)."""
    evaluation = evaluation or _evaluation(spec, run)
    arts = {s: run.load_artifact(s, PtqModel) for s in _done(run)}
    integer = _integer(run, arts)
    original = onnx.load(str(run.path(run.load_artifact("original", PtqModel).onnx_file)))
    at = feeds.judged_index(original, spec.compare.output, evaluation.labels is not None)
    return {s: _model(run, s, arts, evaluation.inputs, integer, at) for s in arts}


def _done(run: Run) -> list[str]:
    stages = run.manifest().stages
    return [s for s in CHAIN if stages.get(s) and stages[s].status == "complete"]


def _evaluation(spec, run: Run) -> Split:
    d = spec.data
    split = load_splits(d.dataset, d.calibration_samples, d.evaluation_samples)["evaluation"]
    original = run.path(run.load_artifact("original", PtqModel).onnx_file)
    return feeds.align_splits({"evaluation": split}, original)["evaluation"]


def _spec(spec) -> SimpleNamespace:
    """What analysis.analyze_models reads of a spec, from the PTQ spec (its compare
    section as the QAT chain's: the judged output and the primary metric)."""
    return SimpleNamespace(
        data=SimpleNamespace(batch_size=spec.data.batch_size),
        compare=spec.judging(),
        stages=SimpleNamespace(board_sim=SimpleNamespace(runtime_format="featuremap")),
    )


def _integer(run: Run, arts: dict) -> dict:
    art = arts.get("quantized")
    return json.loads(run.path(art.layers_file).read_text()) if art else {}


def _model(run: Run, stage: str, arts: dict, inputs: dict, integer: dict, at: int):
    if stage == "board":  # the board runs the hbm stage's program
        return runners.hbm_model(stage, run.path(arts["hbm"].hbm_file), inputs, integer, at)
    art = arts[stage]
    path = run.path(art.hbm_file if stage == "hbm" else art.onnx_file)
    return LOADERS[stage](stage, path, inputs, integer, at)


def layer_graph(model: onnx.ModelProto) -> dict[str, Layer]:
    """Layers of a QDQ graph in node order: op type of each layer's compute node, and the
    layers whose tensors its nodes read."""
    tensors = runners.layer_tensors(model)
    owner = {t: lid for lid, t in tensors.items()}
    layers: dict[str, Layer] = {}
    for node in model.graph.node:
        lid = {p.key: p.value for p in node.metadata_props}.get(runners.LAYER_KEY)
        if not lid or "[weight]" in node.name:
            continue
        prev = layers.get(lid)
        op = prev.op_type if prev and node.op_type in ("QuantizeLinear", "DequantizeLinear") \
            else node.op_type.lower()  # fmt: skip
        producers = [owner[i] for i in node.input if i in owner and owner[i] != lid]
        merged = tuple(dict.fromkeys([*(prev.producers if prev else ()), *producers]))
        layers[lid] = Layer(lid, op, prev.topo_index if prev else len(layers), merged)
    return layers


def onnx_flops(model: onnx.ModelProto, layers: dict[str, Layer], shapes: dict) -> dict[str, int]:
    """Layer id -> flops per sample of a PTQ run's layers in ``shapes`` (analysis.flops'
    rule: 2 x MACs): a Conv, Gemm or MatMul on a constant weight has
    ``output elements x weight elements / output channels`` MACs, its weight's shape read
    from the initializer its ``<layer>[weight]/q`` node quantizes (``axis``: the output
    channel); any other op but a MatMul of two activations (not counted) has 0."""
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    out = {lid: 0 for lid in shapes if lid in layers and layers[lid].op_type != "matmul"}
    for node in model.graph.node:
        lid = layer_of(node)
        w = inits.get(node.input[0]) if node.input else None
        if not node.name.endswith("[weight]/q") or lid not in shapes or not w:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)  # ONNX's default
        out[lid] = 2 * math.prod(shapes[lid]) * math.prod(w) // w[axis]
    return out
