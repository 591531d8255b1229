"""Arrow schemas of the tables SQL sees (docs/design.md "Tables"): names are the contract.

Add columns, never rename them. ``sample_id`` is null on dataset-level (aggregate) rows of
``layer_stats``; ``aggregate`` then says how they were reduced ("all": over every sample).
"""

from __future__ import annotations

import pyarrow as pa


def _fields(*specs: tuple[str, pa.DataType] | tuple[str, pa.DataType, bool]) -> pa.Schema:
    """A schema from (name, type[, nullable]) tuples; run_id is never null."""
    out = []
    for spec in specs:
        name, dtype = spec[0], spec[1]
        nullable = spec[2] if len(spec) > 2 else name != "run_id"
        out.append(pa.field(name, dtype, nullable=nullable))
    return pa.schema(out)


TS = pa.timestamp("us", tz="UTC")
"""Timestamps: microseconds, UTC."""

RUNS = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("started_at", TS),
        pa.field("finished_at", TS),
        pa.field("status", pa.string()),
        pa.field("spec_digest", pa.string()),
        pa.field("model", pa.string()),
        pa.field("march", pa.string()),
        pa.field("consistency_level", pa.string()),
        pa.field("settings", pa.string()),  # JSON of the toolchain settings
        pa.field("code_version", pa.string()),
        pa.field("tags", pa.string()),  # JSON of the spec's tags
    ]
)
"""One row per run."""

STAGES = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("status", pa.string()),
        pa.field("started_at", TS),
        pa.field("finished_at", TS),
        pa.field("duration_s", pa.float64()),
        pa.field("artifact_digest", pa.string()),
        pa.field("cache_hit", pa.bool_()),
    ]
)
"""One row per stage of a run."""

METRICS = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("n_samples", pa.int64()),
        pa.field("output", pa.string()),
    ]
)
"""Dataset-level metrics per stage of a run (top1, cosine... stages.evaluate): ``output``
names the model output a metric judges (null: a task metric, a count, or a file written
before outputs were recorded)."""


LAYER_STATS = _fields(
    ("run_id", pa.string()),
    ("base_stage", pa.string()),
    ("analysis_stage", pa.string()),
    ("layer_id", pa.string()),
    ("op_type", pa.string()),
    ("topo_index", pa.int64()),
    ("dtype", pa.string()),
    ("scale", pa.float64()),
    ("sample_id", pa.int64()),
    ("aggregate", pa.string()),
    ("n_elements", pa.int64()),
    ("cosine", pa.float64()),
    ("mse", pa.float64()),
    ("l1", pa.float64()),
    ("max_abs", pa.float64()),
    ("sqnr_db", pa.float64()),
    ("max_qscale_diff", pa.float64()),
    ("exact_ratio", pa.float64()),
    ("base_min", pa.float64()),
    ("base_max", pa.float64()),
    ("base_mean", pa.float64()),
    ("analysis_min", pa.float64()),
    ("analysis_max", pa.float64()),
    ("analysis_mean", pa.float64()),
    ("base_nan_count", pa.int64()),
    ("analysis_nan_count", pa.int64()),
    ("rtol", pa.float64()),
    ("kl", pa.float64()),
    ("base_var", pa.float64()),
    ("analysis_var", pa.float64()),
)
"""Per-layer comparison of two stages: one row per sample and layer, plus aggregate rows."""

LAYER_TENSORS = _fields(
    ("run_id", pa.string()),
    ("base_stage", pa.string()),
    ("analysis_stage", pa.string()),
    ("layer_id", pa.string()),
    ("sample_id", pa.int64()),
    ("reason", pa.string()),
    ("side", pa.string()),
    ("shape", pa.list_(pa.int64())),
    ("scale", pa.float64()),
    ("values", pa.list_(pa.float32())),
)
"""Full tensors of a few probe or bad-case samples only (reason: probe | badcase)."""

STAGE_OUTPUTS = _fields(
    ("run_id", pa.string()),
    ("stage", pa.string()),
    ("output_id", pa.string()),
    ("sample_id", pa.int64()),
    ("values", pa.list_(pa.float32())),
)
"""Every stage model's outputs on every evaluation sample, as its metrics were measured
on them (flattened; the float model's are prepare's). The analysis compares stages' outputs
on every sample from here, and their layers on ``compare.samples`` only."""

BADCASES = _fields(
    ("run_id", pa.string()),
    ("base_stage", pa.string()),
    ("analysis_stage", pa.string()),
    ("metric", pa.string()),
    ("rank", pa.int64()),
    ("sample_id", pa.int64()),
    ("value", pa.float64()),
    ("label", pa.int64()),
    ("base_pred", pa.int64()),
    ("analysis_pred", pa.int64()),
)
"""The samples whose outputs differ most between two stages, ranked by a metric."""

SENSITIVITY = _fields(
    ("run_id", pa.string()),
    ("base_stage", pa.string()),
    ("analysis_stage", pa.string()),
    ("metric", pa.string()),
    ("target", pa.string()),
    ("layer_id", pa.string()),
    ("op_type", pa.string()),
    ("topo_index", pa.int64()),
    ("rank", pa.int64()),
    ("before", pa.float64()),
    ("after", pa.float64()),
    ("improvement", pa.float64()),
)
"""Reverting one layer (target: layer | activation | weight) to the base stage, or an int16
override tried on calibrate's model (target: int16; analysis.advice): output metric
before/after, improvement positive when it restores."""

LOCALIZATION = _fields(
    ("run_id", pa.string()),
    ("kind", pa.string()),
    ("rank", pa.int64()),
    ("stage", pa.string()),
    ("base_stage", pa.string()),
    ("layer_id", pa.string()),
    ("op_type", pa.string()),
    ("metric", pa.string()),
    ("value", pa.float64()),
    ("threshold", pa.float64()),
    ("detail", pa.string()),
)
"""Findings of the localizer, long format: kind = stage | layer | sensitive | triage."""

FAULTS = _fields(
    ("run_id", pa.string()),
    ("stage", pa.string()),
    ("layer_id", pa.string()),
    ("op_type", pa.string()),
    ("kind", pa.string()),
    ("amount", pa.float64()),
    ("detail", pa.string()),
    ("changed", pa.bool_()),
    ("reason", pa.string()),
)
"""Faults injected by the spec (proof that localization works); ``changed``: whether the
fault changed what its stage computes (stages.fault_effects), ``reason`` says how."""

SCHEMAS: dict[str, pa.Schema] = {
    "runs": RUNS,
    "stages": STAGES,
    "metrics": METRICS,
    "layer_stats": LAYER_STATS,
    "layer_tensors": LAYER_TENSORS,
    "stage_outputs": STAGE_OUTPUTS,
    "badcases": BADCASES,
    "sensitivity": SENSITIVITY,
    "localization": LOCALIZATION,
    "faults": FAULTS,
}
"""Every table by name."""
