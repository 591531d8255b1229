"""One self-contained HTML report of a run (issue #7): what ``qparity report RUN`` writes.

:func:`gather` reads the run's manifest and tables into a :class:`ReportData`;
analysis/report_html.py renders it as one HTML file (inline CSS, a few lines of inline JS,
HTML tables for the charts, no external URL). The heatmap holds the ``layer_stats``
aggregate rows (``sample_id`` null) of the chain pairs, which are the ``localization`` rows
of kind ``stage`` (each stage against the one before it): rows are layers in ``topo_index``
order, columns the analysis stages, and the cell of the first divergent layer
(``localization`` kind ``layer``, rank 1) is marked. A run without analysis tables still
gets a report, which says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from analysis.primary import run_primary
from analysis.report_html import render
from analysis.tolerance import camera_limit
from schemas.errors import QparityError
from schemas.fileio import atomic_write_text
from schemas.spec import STAGE_NAMES, PipelineSpec, load_spec
from schemas.spec_sections import Thresholds
from schemas.store import Run
from schemas.tables import read_run_table

REPORT_NAME = "report.html"
"""The report's file name inside the run folder (the default output)."""

VENDOR_FILES = (
    "compare_per_layer_out.txt",
    "compare_per_layer_out.csv",
    "badcase.txt",
    "abnormal_layer_advisor.txt",
)
"""The vendor-style files of the debug folder the report links to (plus the sensitive ops)."""

SUMMARY_KINDS = ("stage", "layer", "triage")
"""The localization rows shown in the summary (the sensitive ones have their own table)."""


@dataclass
class Heatmap:
    """Aggregate layer_stats of the chain pairs: one column per pair, one row per layer."""

    pairs: list[tuple[str, str]]
    """(base_stage, analysis_stage) in chain order."""
    layers: list[dict]
    """layer_id, op_type and topo_index of every layer, in topological order."""
    cells: dict[tuple[str, str], dict]
    """(layer_id, analysis_stage) -> the aggregate layer_stats row."""
    first: tuple[str, str] | None
    """(analysis_stage, layer_id) of the first divergent cell, if any."""
    thresholds: Thresholds
    """The run's pass/fail thresholds (they set the colour scale)."""
    limits: dict[tuple[str, str], float] = field(default_factory=dict)
    """(layer_id, analysis_stage) -> the steps that layer may be off where the localizer
    allows it more than the thresholds: board_sim's camera input
    (:func:`analysis.tolerance.camera_limit`)."""


@dataclass
class ReportData:
    """Everything the report shows, read from one run."""

    run_id: str
    header: list[tuple[str, str]]
    chain: list[dict]
    heatmap: Heatmap | None
    localization: list[dict] = field(default_factory=list)
    sensitivity: list[dict] = field(default_factory=list)
    badcases: list[dict] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    """(label, href relative to the report) of the vendor-style files that exist."""


def write_report(run: Run, out_path: Path | None = None) -> Path:
    """Write the run's HTML report (default ``<run>/report.html``); return its path."""
    path = Path(out_path) if out_path is not None else run.path(REPORT_NAME)
    if path.is_dir():
        path = path / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render(gather(run, path.parent)))
    return path


def gather(run: Run, report_dir: Path) -> ReportData:
    """Read the run's manifest and tables; links are relative to ``report_dir``."""
    loc = read_run_table(run, "localization")
    summary = [r for r in loc if r["kind"] in SUMMARY_KINDS]
    summary.sort(key=lambda r: (SUMMARY_KINDS.index(r["kind"]), stage_position(r["stage"])))
    return ReportData(
        run_id=run.run_id,
        header=_header(run),
        chain=_chain(run),
        heatmap=_heatmap(run, loc),
        localization=summary,
        sensitivity=sorted(
            read_run_table(run, "sensitivity"),
            key=lambda r: (stage_position(r["analysis_stage"]), r["rank"]),
        ),
        badcases=sorted(
            read_run_table(run, "badcases"),
            key=lambda r: (stage_position(r["analysis_stage"]), r["base_stage"], r["rank"]),
        ),
        links=_links(run, report_dir),
    )


def stage_position(stage: str | None) -> int:
    """Chain position of a stage; unknown names (e.g. 'float') first."""
    return STAGE_NAMES.index(stage) if stage in STAGE_NAMES else -1


def _header(run: Run) -> list[tuple[str, str]]:
    """Run id, spec name, status, model, march, consistency level, code version, ..."""
    m = run.manifest()
    row = next(iter(read_run_table(run, "runs")), {})
    tags = json.loads(row["tags"]) if row.get("tags") else m.tags
    return [
        ("run id", m.run_id),
        ("spec name", m.name),
        ("status", m.status),
        ("model", row.get("model") or "-"),
        ("march", row.get("march") or "-"),
        ("consistency level", row.get("consistency_level") or "-"),
        ("code version", m.code_version or row.get("code_version") or "-"),
        ("started", m.started_at),
        ("finished", m.finished_at or "-"),
        ("parent run", m.parent_run or "-"),
        ("tags", ", ".join(f"{k}={v}" for k, v in sorted(tags.items())) or "-"),
    ]


def _chain(run: Run) -> list[dict]:
    """One row per stage (and 'float' if measured): status, time, cache, the primary metric
    (analysis.primary: top1 with labels, else cosine, or compare.primary) and its change."""
    primary = run_primary(run)
    records = run.manifest().stages
    names = sorted(set(records) | set(primary.values), key=lambda s: (stage_position(s), s))
    rows, previous = [], None
    for name in names:
        rec, value = records.get(name), primary.values.get(name)
        rows.append({
            "stage": name, "status": rec.status if rec else "-",
            "duration_s": rec.duration_s if rec else None,
            "cache_hit": rec.cache_hit if rec else None, "metric": primary.name,
            "value": value, "n_samples": primary.samples.get(name),
            "change": value - previous if value is not None and previous is not None else None,
        })  # fmt: skip
        previous = value if value is not None else previous
    return rows


def _heatmap(run: Run, loc: list[dict]) -> Heatmap | None:
    """The chain pairs' aggregate rows by (layer, stage); None without analysis tables."""
    stage_rows = sorted(
        (r for r in loc if r["kind"] == "stage"), key=lambda r: stage_position(r["stage"])
    )
    pairs = [(r["base_stage"], r["stage"]) for r in stage_rows]
    wanted = set(pairs)
    rows = [
        r
        for r in read_run_table(run, "layer_stats")
        if r["sample_id"] is None and (r["base_stage"], r["analysis_stage"]) in wanted
    ]
    if not rows:
        return None
    layers: dict[str, dict] = {}
    for r in rows:
        layers.setdefault(r["layer_id"], {k: r[k] for k in ("layer_id", "op_type", "topo_index")})
    first = next((r for r in loc if r["kind"] == "layer" and r["rank"] == 1), None)
    spec = _spec(run)
    return Heatmap(
        pairs=pairs,
        layers=sorted(layers.values(), key=lambda x: (x["topo_index"], x["layer_id"])),
        cells={(r["layer_id"], r["analysis_stage"]): r for r in rows},
        first=(first["stage"], first["layer_id"]) if first else None,
        thresholds=spec.compare.thresholds if spec else Thresholds(),
        limits=_camera_limits(spec, rows) if spec else {},
    )


def _spec(run: Run) -> PipelineSpec | None:
    """The run's spec; None if it cannot be read (the schema's thresholds are used)."""
    try:
        return load_spec(run.path("spec.yaml"))
    except QparityError:
        return None


def _camera_limits(spec: PipelineSpec, rows: list[dict]) -> dict[tuple[str, str], float]:
    """board_sim's camera input against compile's: the camera path's modelled rounding."""
    out = {}
    for r in rows:
        camera = (r["base_stage"], r["analysis_stage"]) == ("compile", "board_sim")
        if camera and r["layer_id"].startswith("input:"):
            allowed = camera_limit(spec, r["scale"] or 0.0)
            if allowed is not None:
                out[(r["layer_id"], r["analysis_stage"])] = allowed
    return out


def _links(run: Run, report_dir: Path) -> list[tuple[str, str]]:
    """The vendor-style files that exist, each with its href relative to ``report_dir``."""
    debug = run.path("debug")
    found = [debug / name for name in VENDOR_FILES]
    found += sorted(debug.glob("output_*_sensitive_ops.txt"))
    found += sorted(debug.glob("compare/*/compare_per_layer_out.*"))
    return [
        (
            str(p.relative_to(debug)),
            quote(Path(os.path.relpath(p, report_dir.resolve())).as_posix()),
        )
        for p in found
        if p.is_file()
    ]
