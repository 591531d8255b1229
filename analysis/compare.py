"""Stream every stage model over the same evaluation batches and compare them layer by layer.

Each batch is run through the stage models one by one in chain order; a stage pair is
compared (:mod:`analysis.metrics`) as soon as both its sides are captured, on a worker
thread while the next model runs, and a model's capture is dropped as soon as no pair of
the batch still needs it: the chain's pairs and the QAT reference's hold at most three
models' captures at once (the reference's, the previous stage's, the current one's), never
all of them. Each pair's per-sample rows go to
``tables/layer_stats/<base>__<analysis>/b<batch>.parquet``, so memory holds one batch,
never the dataset. Aggregates (``sample_id`` null, ``aggregate = 'all'``) follow from
running sums at the end. Layers only one side captures are listed, not dropped.
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

    ``models`` in chain order (the order they run in on each batch; a model in no pair
    is not run). ``scales`` (layer id -> quantization step, e.g. the integer graph's)
    wins over the steps the stage models report."""
    results = {p: PairResult(*p, run_id=ctx.run.run_id) for p in pairs}
    for r in results.values():
        remove_parts(ctx.run, f"tables/layer_stats/{r.name}")
    n = min(len(ctx.evaluation), ctx.spec.compare.samples or len(ctx.evaluation))
    stored = stored_outputs(ctx, list(models))  # outputs on every sample, or None
    bs = compare_batch(ctx, models, pairs)
    for b, start in enumerate(range(0, n, bs)):
        idx = np.arange(start, min(start + bs, n))
        setup = (layers, scales or {}) if b == 0 else None
        parts = _stream(ctx, models, results, idx, setup, (layers, dtypes), stored is None)
        tick("compare", int(idx[-1]) + 1, n)
        for r, cols in zip(results.values(), parts, strict=True):  # one by one (manifest)
            write_columns(ctx.run, "layer_stats", cols, f"{r.name}/b{b:05d}")
    for r in results.values():
        if stored is not None:
            _stored_batches(ctx, r, stored, layers, dtypes)
        _aggregate(ctx, r, layers, dtypes)
    return results


def compare_batch(
    ctx: RunContext, models: dict[str, StageModel], pairs: list[tuple[str, str]]
) -> int:
    """Samples per comparison batch: ``data.batch_size``, fewer when the largest set of
    captures alive at once (:func:`alive_sets`; each model's measured on sample 0) would
    pass ``compare.memory_mb``.

    FORMULA: ``max(1, min(batch_size, memory_mb * 2**20 // max_k sum_{s in alive_k}
    (bytes of model s's output and layer tensors of one sample)))``, ``alive_k`` the
    captures alive while the k-th model runs (:func:`alive_sets`)."""
    order = _order(models, pairs)
    size = {s: _nbytes(models[s].run(np.arange(1))) for s in order}
    per_sample = max((sum(size[s] for s in alive) for alive in alive_sets(order, pairs)), default=0)
    budget = ctx.spec.compare.memory_mb * 2**20
    return max(1, min(ctx.spec.data.batch_size, int(budget // max(per_sample, 1))))


def alive_sets(order: list[str], pairs) -> list[list[str]]:
    """Per model of ``order`` (the run order): the captures alive while it runs, its own
    and each earlier one a pair still needs, paired with it or a later model."""
    return [
        [s for s in order[:k] if any(s in p and set(p) & set(order[k:]) for p in pairs)]
        + [order[k]]
        for k in range(len(order))
    ]


def _order(models: dict[str, StageModel], pairs) -> list[str]:
    """The models the pairs use, in ``models``' (chain) order."""
    used = {s for p in pairs for s in p}
    return [s for s in models if s in used]


def _nbytes(captured) -> int:
    out, values = captured
    return int(np.asarray(out).nbytes + sum(np.asarray(v).nbytes for v in values.values()))


def _stream(ctx, models, results: dict, idx, setup, where, with_output: bool) -> list[dict]:
    """:func:`_batch` of every pair on one comparison batch: the models run one by one in
    chain order, each pair is submitted to :data:`WORKERS` threads once both its sides
    are captured (numpy releases the GIL in its array loops, so the metrics use both
    cores while the next model runs), and a capture no later pair needs is dropped (its
    pairs' jobs done) before the next model runs. ``setup``: (layers, scales) on the
    first batch (:func:`_setup`), else None. Returns the columns in ``results``' order."""
    order = _order(models, results)
    runs: dict = {}  # stage -> its capture of this batch; the jobs read it from here
    jobs: dict = {}
    with ThreadPoolExecutor(WORKERS) as pool:
        for stage, alive in zip(order, alive_sets(order, results), strict=True):
            _drop(runs, jobs, keep=alive)
            runs[stage] = models[stage].run(idx)
            for pair, r in results.items():
                if stage in pair and pair not in jobs and all(s in runs for s in pair):
                    if setup is not None:
                        _setup(r, runs[r.base][1], runs[r.analysis][1], models, *setup, len(idx))
                    jobs[pair] = pool.submit(_batch, ctx, r, runs, idx, where, with_output)
        return [jobs[p].result() for p in results]


def _drop(runs: dict, jobs: dict, keep: list[str]) -> None:
    """Drop every capture but ``keep``'s, once the jobs of its pairs are done."""
    for stage in [s for s in runs if s not in keep]:
        for pair, job in jobs.items():
            if stage in pair:
                job.result()
        del runs[stage]


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


def _batch(ctx, r: PairResult, runs: dict, idx, where, with_output: bool) -> dict:
    """One batch of one pair: the columns of the per-sample rows of every layer (and of
    the output, unless it is compared from the stored outputs); totals. ``runs``: stage
    -> capture (read here, on the worker: it holds no capture once it returns);
    ``where``: (layers, dtypes)."""
    (out_a, base), (out_b, ana) = runs[r.base], runs[r.analysis]
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
