"""Stream every stage model over the same evaluation batches and compare them layer by layer.

Each batch is run once through every stage model; every requested stage pair is then
compared on that batch (:mod:`analysis.metrics`) and its per-sample rows are written to
``tables/layer_stats/<base>__<analysis>/b<batch>.parquet`` at once, so memory holds one
batch, never the dataset. Aggregates (``sample_id`` null, ``aggregate = 'all'``) follow
from running sums at the end. Layers only one side captures are listed, not dropped.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from analysis.layer_graph import Layer, ordered
from analysis.metrics import METRICS, Accumulator, finish, hist_edges, step_of, sums
from analysis.stored_outputs import stored_outputs
from schemas.table_digests import remove_parts
from schemas.tables import write_columns
from stages.context import RunContext
from stages.progress import tick
from stages.stage_models import StageModel

OUTPUT = "<output>"
"""The pseudo layer id of a model's final output."""
WORKERS = 2
"""Threads computing the pairs' metrics of a comparison batch (the machine's cores)."""
OUTPUT_CHUNK = 256
"""Samples per part of the output rows compared from the stored outputs."""


@dataclass
class PairResult:
    """What one stage pair gave: aggregates per layer, per-sample output agreement."""

    base: str
    analysis: str
    run_id: str = ""
    layer_ids: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)
    """Layers whose tensor has no batch dimension (a reshaped parameter such as ConvNeXt's
    layer scale): the same for every sample, so not compared per sample."""
    steps: dict[str, float] = field(default_factory=dict)
    edges: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Layer id -> the [lo, hi] of its KL histograms (fixed on the first batch)."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Layer id -> its tensor's shape for one sample (batch dimension 1)."""
    acc: dict[str, Accumulator] = field(default_factory=dict)
    aggregates: dict[str, dict[str, float]] = field(default_factory=dict)
    output: dict[str, list] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.base}__{self.analysis}"

    def per_sample(self, key: str) -> np.ndarray:
        return np.concatenate(self.output[key]) if self.output.get(key) else np.zeros(0)


def compare_stages(
    ctx: RunContext,
    models: dict[str, StageModel],
    pairs: list[tuple[str, str]],
    layers: dict[str, Layer],
    dtypes: dict[str, str],
    scales: dict[str, float] | None = None,
) -> dict[tuple[str, str], PairResult]:
    """Compare every pair over the evaluation split; writes layer_stats; returns results.

    ``scales`` (layer id -> quantization step, e.g. the integer graph's) wins over the
    steps the stage models report."""
    results = {p: PairResult(*p, run_id=ctx.run.run_id) for p in pairs}
    for r in results.values():
        remove_parts(ctx.run, f"tables/layer_stats/{r.name}")
    n = min(len(ctx.evaluation), ctx.spec.compare.samples or len(ctx.evaluation))
    stored = stored_outputs(ctx, list(models))  # outputs on every sample, or None
    bs = compare_batch(ctx, models)
    for b, start in enumerate(range(0, n, bs)):
        idx = np.arange(start, min(start + bs, n))
        runs = {s: m.run(idx) for s, m in models.items()}
        tick("compare", int(idx[-1]) + 1, n)
        for (base, ana), r in results.items():
            if b == 0:
                _setup(r, runs[base][1], runs[ana][1], models, layers, scales or {}, len(idx))
        parts = _pairs_batch(ctx, results, runs, idx, (layers, dtypes), stored is None)
        for r, cols in zip(results.values(), parts, strict=True):  # one by one (manifest)
            write_columns(ctx.run, "layer_stats", cols, f"{r.name}/b{b:05d}")
    for r in results.values():
        if stored is not None:
            _stored_batches(ctx, r, stored, layers, dtypes)
        _aggregate(ctx, r, layers, dtypes)
    return results


def compare_batch(ctx: RunContext, models: dict[str, StageModel]) -> int:
    """Samples per comparison batch: ``data.batch_size``, fewer when what every stage model
    captures for them (measured on sample 0) would pass ``compare.memory_mb``.

    FORMULA: ``max(1, min(batch_size, memory_mb * 2**20 // sum_models(bytes of one
    sample's output and layer tensors)))``."""
    per_sample = sum(_nbytes(m.run(np.arange(1))) for m in models.values())
    budget = ctx.spec.compare.memory_mb * 2**20
    return max(1, min(ctx.spec.data.batch_size, int(budget // max(per_sample, 1))))


def _nbytes(captured) -> int:
    out, values = captured
    return int(np.asarray(out).nbytes + sum(np.asarray(v).nbytes for v in values.values()))


def _setup(r: PairResult, base: dict, ana: dict, models, layers, scales, n: int) -> None:
    """Fix the compared layers (those of both sides with one tensor per sample of the
    ``n``-sample batch) and each one's quantization step on the first batch."""
    both = [k for k in base if k in ana]
    per_sample = [k for k in both if np.shape(base[k])[:1] == np.shape(ana[k])[:1] == (n,)]
    r.constants = [k for k in both if k not in per_sample]
    r.layer_ids = ordered(layers, per_sample)
    r.unmapped = sorted(set(base) ^ set(ana))
    for lid in r.layer_ids:
        scale = scales.get(lid) or models[r.analysis].scales.get(lid)
        scale = scale or models[r.base].scales.get(lid)
        r.steps[lid] = step_of(scale, base[lid])
    r.acc = {lid: Accumulator() for lid in [*r.layer_ids, OUTPUT]}


def _pairs_batch(ctx, results: dict, runs: dict, idx, where, with_output: bool) -> list[dict]:
    """:func:`_batch` of every pair on one comparison batch, on :data:`WORKERS` threads
    (numpy releases the GIL in its array loops, so the metrics use both cores)."""
    with ThreadPoolExecutor(WORKERS) as pool:
        jobs = [pool.submit(_batch, ctx, r, runs[r.base], runs[r.analysis], idx, where, with_output)
                for r in results.values()]  # fmt: skip
        return [job.result() for job in jobs]


def _batch(ctx, r: PairResult, base_run, ana_run, idx, where, with_output: bool) -> dict:
    """One batch of one pair: the columns of the per-sample rows of every layer (and of
    the output, unless it is compared from the stored outputs); totals. ``where``:
    (layers, dtypes)."""
    (out_a, base), (out_b, ana) = base_run, ana_run
    layers, dtypes = where
    cols: dict[str, list] = {}
    for lid in r.layer_ids:
        _compare(ctx, r, lid, (base[lid], ana[lid]), idx, cols, layers, dtypes)
    if with_output:
        _compare(ctx, r, OUTPUT, (out_a, out_b), idx, cols, layers, dtypes)
    return cols


def _stored_batches(ctx, r: PairResult, stored: dict[str, np.ndarray], layers, dtypes) -> None:
    """The output rows of one pair on every evaluation sample, from the stored outputs,
    in parts of :data:`OUTPUT_CHUNK` samples."""
    a_all, v_all = stored[r.base], stored[r.analysis]
    for b, start in enumerate(range(0, len(a_all), OUTPUT_CHUNK)):
        idx = np.arange(start, min(start + OUTPUT_CHUNK, len(a_all)))
        cols: dict[str, list] = {}
        _compare(ctx, r, OUTPUT, (a_all[idx], v_all[idx]), idx, cols, layers, dtypes)
        write_columns(ctx.run, "layer_stats", cols, f"{r.name}/o{b:05d}")


def _compare(ctx, r: PairResult, lid: str, pair, idx, cols, layers, dtypes) -> None:
    """One layer (or the output) of one pair on the samples ``idx``: its rows into
    ``cols``, its totals; the output's per-sample agreement too."""
    a, v = pair
    if lid not in r.edges:  # fixed on the first batch
        if lid not in r.steps:  # the output's (a layer's is its scale: _setup)
            r.steps[lid] = step_of(None, a)
        r.edges[lid], r.shapes[lid] = hist_edges(a, v), (1, *np.shape(a)[1:])
    s = sums(a, v, r.steps[lid], r.edges[lid])
    r.acc[lid].add(s)
    m = finish(s, r.steps[lid])
    if lid == OUTPUT:
        _record_output(ctx, r, idx, a, v, m)
    _append(cols, r, lid, layers, dtypes, m, s, idx)


def _record_output(ctx, r: PairResult, idx, out_a, out_b, m) -> None:
    pa_, pb = out_a.reshape(len(idx), -1).argmax(1), out_b.reshape(len(idx), -1).argmax(1)
    labels = ctx.evaluation.labels
    y = labels[idx] if labels is not None else np.full(len(idx), -1)  # -1: no label
    # without labels a flip is a changed prediction (correctness against the base's)
    flip = (pa_ == y) != (pb == y) if labels is not None else pa_ != pb
    for key, val in (
        ("sample_id", idx), ("l1", m["l1"]), ("cosine", m["cosine"]), ("mse", m["mse"]),
        ("sqnr_db", m["sqnr_db"]), ("flip", flip.astype(np.float64)),
        ("label", y), ("base_pred", pa_), ("analysis_pred", pb),
    ):  # fmt: skip
        r.output.setdefault(key, []).append(np.asarray(val))


def _append(cols, r: PairResult, lid, layers, dtypes, m, s, idx, aggregate=None) -> None:
    """Rows of one layer (one per sample in ``idx``, or one aggregate row) into ``cols``."""
    k = len(idx)
    layer = layers.get(lid)
    fixed = {
        "run_id": r.run_id, "base_stage": r.base, "analysis_stage": r.analysis,
        "layer_id": lid, "op_type": layer.op_type if layer else ("output" if lid == OUTPUT
        else "input"), "topo_index": layer.topo_index if layer else (10**6 if lid == OUTPUT
        else -1), "dtype": dtypes.get(lid), "scale": r.steps[lid], "aggregate": aggregate,
    }  # fmt: skip
    for key, val in fixed.items():
        cols.setdefault(key, []).extend([val] * k)
    cols.setdefault("sample_id", []).extend([None] * k if aggregate else list(map(int, idx)))
    cols.setdefault("n_elements", []).extend(np.asarray(s["n"]).astype(np.int64).tolist())
    for key in (*METRICS, "base_min", "base_max", "base_mean"):
        cols.setdefault(key, []).extend(np.asarray(m[key], dtype=np.float64).tolist())
    for key in ("analysis_min", "analysis_max", "analysis_mean", "base_var", "analysis_var"):
        cols.setdefault(key, []).extend(np.asarray(m[key], dtype=np.float64).tolist())
    cols.setdefault("base_nan_count", []).extend(np.asarray(s["a_nan"]).astype(int).tolist())
    cols.setdefault("analysis_nan_count", []).extend(np.asarray(s["b_nan"]).astype(int).tolist())


def _aggregate(ctx, r: PairResult, layers, dtypes) -> None:
    """The dataset-level row of every layer (and the output) of one pair."""
    cols: dict[str, list] = {}
    for lid in [*r.layer_ids, OUTPUT]:
        totals = r.acc[lid].totals
        r.aggregates[lid] = r.acc[lid].result(r.steps[lid])
        r.aggregates[lid] |= {
            "base_nan_count": totals["a_nan"],
            "analysis_nan_count": totals["b_nan"],
        }
        m = {k: np.asarray([v]) for k, v in r.aggregates[lid].items()}
        s = {"n": np.asarray([totals["n"]]), "a_nan": np.asarray([totals["a_nan"]])}
        s["b_nan"] = np.asarray([totals["b_nan"]])
        _append(cols, r, lid, layers, dtypes, m, s, [0], aggregate="all")
    write_columns(ctx.run, "layer_stats", cols, f"{r.name}/aggregate")
