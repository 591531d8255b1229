"""export: the deploy graph as QDQ ONNX (the vendor's qat.bc), every node keeping its id.

The deploy graph is the float model traced in eval mode with the QAT model's weights and
quantizer states (stages.deploy) and pre_export's tables (the same fixed-point ops). The
graph is evaluated by onnxruntime, or by onnx's reference evaluator with our custom ops when
the graph has any, so a train-only branch or an op whose ONNX semantics differ shows up as a
metric difference against qat.export. debug/qat_onnx.txt numbers every node.
"""

from __future__ import annotations

import copy

from schemas.artifacts import QatExportModel, QatOnnxModel
from stages.context import RunContext
from stages.deploy import deploy_graph
from stages.evaluate import stage_metrics
from stages.layers import ID_KEY
from stages.modelio import load_qat
from stages.onnx_export import export_onnx, render_graph_text
from stages.onnx_runner import OnnxRunner
from stages.outputs import numpy_fed
from stages.pre_export import load_tables
from stages.registry_types import StageCall
from stages.table_ops import rewrite


def export(upstream: QatExportModel, ctx: RunContext, call: StageCall) -> QatOnnxModel:
    """Write qat.onnx for the deploy graph and evaluate it."""
    deploy, train_only = deploy_graph(
        copy.deepcopy(ctx.float_model), ctx.example, ctx.policy, load_qat(upstream, ctx)
    )
    tables = load_tables(ctx, upstream)
    ids = {n.meta[ID_KEY] for n in deploy.graph.nodes if ID_KEY in n.meta}
    rewrite(deploy, {lid: op for lid, op in tables.items() if lid in ids})
    path = ctx.artifact_dir("export") / "qat.onnx"
    result = export_onnx(deploy, ctx.example, path)
    ctx.write_debug("qat_onnx.txt", render_graph_text(result.model))
    runner = OnnxRunner(path)
    metrics = stage_metrics(ctx, "export", numpy_fed(runner.run), graph=True)
    return call.make(
        QatOnnxModel,
        ctx.run,
        files=["artifacts/export/qat.onnx"],
        onnx_file="artifacts/export/qat.onnx",
        layer_ids=list(result.layer_ids),
        unmapped={**train_only, **result.unmapped},
        backend=runner.backend,
        metrics=metrics,
    )
