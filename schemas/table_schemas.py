"""Columns of the tables SQL sees (docs/design.md "Tables"): names are the contract.

Add columns, never rename them. ``sample_id`` is null on dataset-level (aggregate) rows of
``layer_stats``; ``aggregate`` then says how they were reduced ("all": over every sample).

Each table's columns are declared once, here, with DuckDB's SQL type names: ``qparity sql``
creates its in-memory tables from them without importing pyarrow (0.16 s of its start-up,
bench/cli.py); the Arrow schema the Parquet writers and readers use
(:attr:`TableSchema.arrow`) is derived from the same declaration on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

SQL_TYPES = ("VARCHAR", "BOOLEAN", "INTEGER", "BIGINT", "FLOAT", "DOUBLE", "TIMESTAMPTZ")
"""The column types a table may declare (each also as a list: ``FLOAT[]``)."""


@dataclass(frozen=True)
class Column:
    """One column: its name, its DuckDB type (``BIGINT``, ``FLOAT[]``...), whether it may
    be null."""

    name: str
    type: str
    nullable: bool = True

    def __post_init__(self) -> None:
        if self.type.removesuffix("[]") not in SQL_TYPES:
            raise ValueError(f"column {self.name}: unknown type {self.type!r} (not in SQL_TYPES)")


@dataclass(frozen=True)
class TableSchema:
    """A table's columns in order; iterating gives the :class:`Column` s."""

    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def __iter__(self):
        return iter(self.columns)

    @property
    def arrow(self) -> pa.Schema:
        """The Arrow schema of the same columns (imports pyarrow; made once per table)."""
        return _arrow_schema(self.columns)


def _table(*specs: tuple[str, str] | tuple[str, str, bool]) -> TableSchema:
    """A table from (name, type[, nullable]) tuples; run_id is never null."""
    return TableSchema(tuple(Column(s[0], s[1], s[2] if len(s) > 2 else s[0] != "run_id")
                             for s in specs))  # fmt: skip


@cache
def _arrow_schema(columns: tuple[Column, ...]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field(c.name, arrow_type(c.type), nullable=c.nullable) for c in columns])


def arrow_type(sql_type: str) -> pa.DataType:
    """The Arrow type of a declared column type (``FLOAT[]``: ``list<float32>``)."""
    import pyarrow as pa

    if sql_type.endswith("[]"):
        return pa.list_(arrow_type(sql_type[:-2]))
    return {
        "VARCHAR": pa.string(), "BOOLEAN": pa.bool_(), "INTEGER": pa.int32(),
        "BIGINT": pa.int64(), "FLOAT": pa.float32(), "DOUBLE": pa.float64(),
        "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    }[sql_type]  # fmt: skip


TS = "TIMESTAMPTZ"
"""Timestamps: microseconds, UTC."""

RUNS = _table(
    ("run_id", "VARCHAR", False),
    ("started_at", TS),
    ("finished_at", TS),
    ("status", "VARCHAR"),
    ("spec_digest", "VARCHAR"),
    ("model", "VARCHAR"),
    ("march", "VARCHAR"),
    ("consistency_level", "VARCHAR"),
    ("settings", "VARCHAR"),  # JSON of the toolchain settings
    ("code_version", "VARCHAR"),
    ("tags", "VARCHAR"),  # JSON of the spec's tags
)
"""One row per run."""

STAGES = _table(
    ("run_id", "VARCHAR", False),
    ("stage", "VARCHAR", False),
    ("status", "VARCHAR"),
    ("started_at", TS),
    ("finished_at", TS),
    ("duration_s", "DOUBLE"),
    ("artifact_digest", "VARCHAR"),
    ("cache_hit", "BOOLEAN"),
)
"""One row per stage of a run."""

METRICS = _table(
    ("run_id", "VARCHAR", False),
    ("stage", "VARCHAR", False),
    ("metric", "VARCHAR", False),
    ("value", "DOUBLE"),
    ("n_samples", "BIGINT"),
    ("output", "VARCHAR"),
)
"""Dataset-level metrics per stage of a run (top1, cosine... stages.evaluate): ``output``
names the model output a metric judges (null: a task metric, a count, or a file written
before outputs were recorded)."""


LAYER_STATS = _table(
    ("run_id", "VARCHAR"),
    ("base_stage", "VARCHAR"),
    ("analysis_stage", "VARCHAR"),
    ("layer_id", "VARCHAR"),
    ("op_type", "VARCHAR"),
    ("topo_index", "BIGINT"),
    ("dtype", "VARCHAR"),
    ("scale", "DOUBLE"),
    ("sample_id", "BIGINT"),
    ("aggregate", "VARCHAR"),
    ("n_elements", "BIGINT"),
    ("cosine", "DOUBLE"),
    ("mse", "DOUBLE"),
    ("l1", "DOUBLE"),
    ("max_abs", "DOUBLE"),
    ("sqnr_db", "DOUBLE"),
    ("max_qscale_diff", "DOUBLE"),
    ("exact_ratio", "DOUBLE"),
    ("base_min", "DOUBLE"),
    ("base_max", "DOUBLE"),
    ("base_mean", "DOUBLE"),
    ("analysis_min", "DOUBLE"),
    ("analysis_max", "DOUBLE"),
    ("analysis_mean", "DOUBLE"),
    ("base_nan_count", "BIGINT"),
    ("analysis_nan_count", "BIGINT"),
    ("rtol", "DOUBLE"),
    ("kl", "DOUBLE"),
    ("base_var", "DOUBLE"),
    ("analysis_var", "DOUBLE"),
)
"""Per-layer comparison of two stages: one row per sample and layer, plus aggregate rows."""

LAYER_TENSORS = _table(
    ("run_id", "VARCHAR"),
    ("base_stage", "VARCHAR"),
    ("analysis_stage", "VARCHAR"),
    ("layer_id", "VARCHAR"),
    ("sample_id", "BIGINT"),
    ("reason", "VARCHAR"),
    ("side", "VARCHAR"),
    ("shape", "BIGINT[]"),
    ("scale", "DOUBLE"),
    ("values", "FLOAT[]"),
)
"""Full tensors of a few probe or bad-case samples only (reason: probe | badcase)."""

STAGE_OUTPUTS = _table(
    ("run_id", "VARCHAR"),
    ("stage", "VARCHAR"),
    ("output_id", "VARCHAR"),
    ("sample_id", "BIGINT"),
    ("values", "FLOAT[]"),
)
"""Every stage model's outputs on every evaluation sample, as its metrics were measured
on them (flattened; the float model's are prepare's). The analysis compares stages' outputs
on every sample from here, and their layers on ``compare.samples`` only."""

BADCASES = _table(
    ("run_id", "VARCHAR"),
    ("base_stage", "VARCHAR"),
    ("analysis_stage", "VARCHAR"),
    ("metric", "VARCHAR"),
    ("rank", "BIGINT"),
    ("sample_id", "BIGINT"),
    ("value", "DOUBLE"),
    ("label", "BIGINT"),
    ("base_pred", "BIGINT"),
    ("analysis_pred", "BIGINT"),
)
"""The samples whose outputs differ most between two stages, ranked by a metric."""

SENSITIVITY = _table(
    ("run_id", "VARCHAR"),
    ("base_stage", "VARCHAR"),
    ("analysis_stage", "VARCHAR"),
    ("metric", "VARCHAR"),
    ("target", "VARCHAR"),
    ("layer_id", "VARCHAR"),
    ("op_type", "VARCHAR"),
    ("topo_index", "BIGINT"),
    ("rank", "BIGINT"),
    ("before", "DOUBLE"),
    ("after", "DOUBLE"),
    ("improvement", "DOUBLE"),
)
"""Reverting one layer (target: layer | activation | weight) to the base stage, or an int16
override tried on calibrate's model (target: int16; analysis.advice): output metric
before/after, improvement positive when it restores."""

LOCALIZATION = _table(
    ("run_id", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("rank", "BIGINT"),
    ("stage", "VARCHAR"),
    ("base_stage", "VARCHAR"),
    ("layer_id", "VARCHAR"),
    ("op_type", "VARCHAR"),
    ("metric", "VARCHAR"),
    ("value", "DOUBLE"),
    ("threshold", "DOUBLE"),
    ("detail", "VARCHAR"),
)
"""Findings of the localizer, long format: kind = stage | layer | sensitive | triage."""

FAULTS = _table(
    ("run_id", "VARCHAR"),
    ("stage", "VARCHAR"),
    ("layer_id", "VARCHAR"),
    ("op_type", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("amount", "DOUBLE"),
    ("detail", "VARCHAR"),
    ("changed", "BOOLEAN"),
    ("reason", "VARCHAR"),
)
"""Faults injected by the spec (proof that localization works); ``changed``: whether the
fault changed what its stage computes (stages.fault_effects), ``reason`` says how."""

SCHEMAS: dict[str, TableSchema] = {
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
