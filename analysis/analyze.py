"""The whole analysis of one run: compare, bad cases, localization, sensitivity, files.

Stage pairs: each stage against the next one in chain order, from the float model on
(prepare's model, every quantizer in FLOAT state: float -> calibrate is the quantization
loss itself), and each later stage against the QAT model (calibrate, or qat when enabled). Writes the tables layer_stats, badcases,
layer_tensors, localization and sensitivity of the run, and the vendor-style files in its
debug folder; returns a :class:`Analysis` whose ``summary()`` is what ``qparity localize``
prints.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

from analysis import badcases, vendor_files
from analysis.advice import Advice, advise, render_trials
from analysis.compare import PairResult, compare_stages
from analysis.flops import layer_flops, union_shapes
from analysis.layer_graph import Layer, load_layers
from analysis.localize import (
    FLOAT_STAGES,
    PairVerdict,
    first_divergence,
    judge_pair,
)
from analysis.primary import read_primary
from analysis.quant_parts import parts_from_sums
from analysis.records import localization_rows, sensitivity_rows, trial_rows, write_tensors
from schemas.errors import QueryError
from schemas.spec import STAGE_NAMES
from schemas.tables import read_run_table, write_rows
from stages import resident
from stages.context import RunContext
from stages.stage_models import integer_layers, open_stage_model
from stages.stage_runners import LOADERS

BADCASES = 10
"""Bad cases kept per stage pair (and the samples localization works on)."""


@dataclass
class Analysis:
    """What the analysis of a run found."""

    run_id: str
    chain: list[str]
    verdicts: list[PairVerdict]
    first: PairVerdict | None
    files: list[str]
    judged: str = ""
    """What the stages were judged by: the primary metric and the output it was read on."""

    def summary(self) -> str:
        """The localization summary, a few lines."""
        if not self.verdicts:
            return f"run {self.run_id}: fewer than two comparable stages, nothing to localize"
        if self.first is None:
            pairs = ", ".join(f"{v.base}->{v.analysis}" for v in self.verdicts)
            return (f"run {self.run_id}: no stage diverges ({pairs} within thresholds; "
                    f"judged by {self.judged})")  # fmt: skip
        f = self.first
        top = ", ".join(lid for lid, *_ in f.sensitive[:3]) or "-"
        return "\n".join(
            [
                f"run {self.run_id}: first divergent stage {f.analysis} (vs {f.base}): "
                + "; ".join(f.reasons),
                f"judged by: {self.judged}",
                f"first divergent layer: {f.first_layer} ({_own(f)})",
                f"top sensitive ops: {top}",
                f"triage: {f.triage}",
            ]
        )


def _own(v: PairVerdict) -> str:
    """The first divergent layer's own error, as the pair is judged."""
    lid = v.first_layer
    if lid not in v.own.steps:
        return "the model input, off past what its camera path allows"
    if v.quantization:
        return f"own cosine {v.own.cosine[lid]:.5f}, {v.own.steps[lid]:.3g} steps"
    return f"own error {v.own.steps[lid]:.3g} steps"


def analyze(ctx: RunContext) -> Analysis:
    """Run every analysis of a QAT-chain run and write its tables and debug files."""
    chain = comparable_stages(ctx)
    models = {s: open_stage_model(ctx, s) for s in chain}
    layers = load_layers(ctx.run, _inputs(models, ctx))
    return analyze_models(ctx, chain, models, layers, integer_layers(ctx, required=False))


def analyze_models(
    ctx, chain: list[str], models: dict, layers: dict, integer: dict, flops=None
) -> Analysis:
    """The analysis of any chain of stage models (QAT or PTQ): ``ctx`` gives the run, the
    evaluation split, ``spec.data.batch_size``, ``spec.compare`` and ``write_debug``;
    ``flops(shapes)`` the sensitive ops' flops (default: analysis.flops.layer_flops)."""
    pairs = chain_pairs(chain)
    ref = _reference(chain)  # the QAT model: later stages are its copies
    pairs += [(chain[ref], s) for s in chain[ref + 2 :]]
    dtypes = {k: v["dtype"] for k, v in integer.items()}
    scales = {k: max(v["scale"]) for k, v in integer.items()}
    # read (and verify) the inputs before writing anything: a tampered metrics part must
    # fail here, never overwrite the run's localization tables
    primary = read_primary(ctx.spec, read_run_table(ctx.run, "metrics"))
    results = compare_stages(ctx, models, pairs, layers, dtypes, scales)
    resident.settle()  # the comparison's captures: the judging allocates other shapes
    verdicts, bad_rows = _judge(ctx, chain, models, results, primary, dtypes, layers)
    first = first_divergence(verdicts)
    write_rows(ctx.run, "badcases", bad_rows, "all")
    ctx.write_debug("badcase.txt", badcases.render(bad_rows))
    rows = localization_rows(ctx.run.run_id, verdicts, first, layers)
    write_rows(ctx.run, "localization", rows, "all")
    advice = advise(ctx, chain, models, layers, verdicts, primary.name)
    sens = sensitivity_rows(ctx.run.run_id, verdicts, layers)
    write_rows(ctx.run, "sensitivity", sens + trial_rows(ctx.run.run_id, advice, layers), "all")
    resident.settle()  # the judging's runs and cut graphs, before the tensors table
    write_tensors(ctx, models, results, first, layers)
    file_dtypes = dtypes or _calibrate_dtypes(ctx, layers, advice)
    parts = {(v.base, v.analysis): _parts(v, results, file_dtypes, layers) for v in verdicts}
    flops = flops or functools.partial(layer_flops, ctx.run)
    shapes = union_shapes(r.shapes for r in results.values())
    files = _write_files(
        ctx, results, verdicts, first, layers, file_dtypes, advice, parts, flops(shapes)
    )
    judged = f"{primary.label} of {primary.output}"
    return Analysis(ctx.run.run_id, chain, verdicts, first, files, judged)


def _judge(
    ctx, chain, models, results, primary, dtypes, layers
) -> tuple[list[PairVerdict], list[dict]]:
    """Each chain pair's bad cases and verdict."""
    metric = ctx.spec.compare.badcase_metric
    verdicts, bad_rows = [], []
    for base, ana in chain_pairs(chain):
        picked = badcases.select(results[(base, ana)], metric, BADCASES)
        bad_rows += badcases.rows(results[(base, ana)], picked, metric)
        samples = np.asarray([s for s, _ in picked])
        pair = results[(base, ana)]
        verdicts.append(judge_pair(ctx, models, pair, primary, samples, dtypes, layers))
        resident.settle()  # the pair's runs and cut graphs (judge_pair forgets them)
    return verdicts, bad_rows


def chain_pairs(chain: list[str]) -> list[tuple[str, str]]:
    """The pairs judged in chain order: each stage and the next, but not calibrate -> qat
    (fine-tuning changes the model on purpose; float -> calibrate is the quantization
    loss, and the QAT model is qat's)."""
    return [p for p in zip(chain, chain[1:], strict=False) if p != ("calibrate", "qat")]


def _reference(chain: list[str]) -> int:
    """Index of the QAT model in ``chain``: qat's when it ran, else the first quantized."""
    if "qat" in chain:
        return chain.index("qat")
    return 1 if chain[0] in FLOAT_STAGES else 0


def comparable_stages(ctx: RunContext) -> list[str]:
    """The run's completed stages that have a model to compare, in chain order: the float
    model (prepare's), calibrate's, qat's when QAT fine-tuning ran, and the later stages."""
    done = {s for s, rec in ctx.run.manifest().stages.items() if rec.status == "complete"}
    if "qat" in done and "prepare" not in done:
        done.discard("calibrate")  # no float pair: calibrate -> qat changes on purpose
    chain = [s for s in STAGE_NAMES if s in done and s in LOADERS]
    if len(chain) < 2:
        raise QueryError(
            f"run {ctx.run.run_id} has {len(chain)} comparable stage(s) ({', '.join(chain)})",
            where="localize",
            hint="run the chain at least to calibrate (prepare and calibrate)",
        )
    return chain


def _inputs(models, ctx) -> tuple[str, ...]:
    first = next(iter(models.values()))
    _, values = first.run(np.arange(min(1, len(ctx.evaluation))))
    return tuple(k.split(":", 1)[1] for k in values if k.startswith("input:"))


def _calibrate_dtypes(ctx, layers: dict[str, Layer], advice: Advice | None) -> dict:
    """A run stopped before convert has no integer layer table: calibrate's output
    quantizers give the dtypes (analysis.advice), carried through the passthrough layers
    (relu, pooling, reshapes: prepare's layers.json), which keep their input's scale."""
    dtypes = dict(advice.dtypes) if advice else {}
    try:
        records = json.loads(ctx.run.path("artifacts/prepare/layers.json").read_text())
    except (OSError, ValueError):
        return dtypes
    through = {r["layer_id"] for r in records if r.get("category") == "passthrough"}
    for lid, layer in layers.items():  # topological order: producers first
        src = layer.producers[0] if layer.producers else None
        if lid not in dtypes and lid in through and src in dtypes:
            dtypes[lid] = dtypes[src]
    return dtypes


def _parts(v: PairVerdict, results, dtypes, layers) -> dict:
    """Float -> calibrate: each weighted sensitive op's (weight, activation) share of its
    own error (analysis.quant_parts), from the sums sensitivity streamed over the samples
    its own errors were judged on; {} for any other pair."""
    if not v.quantization or v.own is None:
        return {}
    steps = results[(v.base, v.analysis)].steps
    return {
        lid: parts_from_sums(v.own.parts[lid], steps[lid], dtypes.get(lid))
        for lid, *_ in v.sensitive
        if lid in layers and layers[lid].op_type in vendor_files.WEIGHTED and lid in v.own.parts
    }


def _write_files(
    ctx: RunContext,
    results: dict[tuple[str, str], PairResult],
    verdicts: list[PairVerdict],
    first: PairVerdict | None,
    layers: dict[str, Layer],
    dtypes: dict,
    advice: Advice | None,
    parts: dict[tuple[str, str], dict],
    flops: dict[str, int],
) -> list[str]:
    """The vendor-style files; the first divergent pair's (else the last pair's) at top;
    the int16 trials in calibrate's sensitivity file (made for them if the pair passed);
    ``parts``: :func:`_parts` of each pair; ``flops``: every layer's flops."""
    files = []
    for v in verdicts:
        rows = vendor_files.compare_rows(results[(v.base, v.analysis)], layers, dtypes, v)
        txt, csv_text = vendor_files.render_compare(rows)
        stem = f"compare/{v.base}__{v.analysis}/compare_per_layer_out"
        ctx.write_debug(f"{stem}.txt", txt)
        ctx.write_debug(f"{stem}.csv", csv_text)
        if v is (first or verdicts[-1]):
            ctx.write_debug("compare_per_layer_out.txt", txt)
            ctx.write_debug("compare_per_layer_out.csv", csv_text)
        name = f"output_{v.analysis}_l1_sensitive_ops.txt"
        trials = render_trials(advice) if advice and v.analysis == "calibrate" else ""
        if v.sensitive or trials:
            split = parts.get((v.base, v.analysis))
            text = (
                vendor_files.render_sensitive(v, layers, dtypes, flops, split)
                if v.sensitive
                else ""
            )
            ctx.write_debug(name, text + ("\n" if text and trials else "") + trials)
            files.append(f"debug/{name}")
    top = first or verdicts[-1]
    pair = vendor_files.advisor_pair(results, (top.base, top.analysis))
    advisor = vendor_files.advisor(results[pair], layers, dtypes, advice)
    ctx.write_debug("abnormal_layer_advisor.txt", advisor)
    files += [
        f"debug/{n}"
        for n in (
            "compare_per_layer_out.txt",
            "compare_per_layer_out.csv",
            "abnormal_layer_advisor.txt",
            "badcase.txt",
        )
    ]
    return [str(ctx.run.path(f)) for f in files]
