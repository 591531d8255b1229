"""HTML of the run report (analysis/report.py): one file, inline CSS and a little inline JS.

Every string that comes from a run goes through :func:`html.escape`. The heatmap's colour
is the cell's error relative to the run's threshold: ``r = (1 - cosine) / (1 - threshold)``
or ``r = max_qscale_diff / threshold``, shown as ``s = sqrt(r) / (1 + sqrt(r))`` so that a
cell at the threshold is half way (yellow), clean cells are green and worse ones red.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

from analysis.tolerance import EPS, total_limit

if TYPE_CHECKING:
    from analysis.report import Heatmap, ReportData

HUE_CLEAN, HUE_BAD = 130.0, 0.0
"""HSL hues of a perfect cell and of an infinitely bad one."""
LIGHT_CLEAN, LIGHT_BAD = 88.0, 58.0
"""HSL lightness (%) of the same two ends: bad cells are darker too."""
NOT_JUDGED = "#dde3ee"
"""The colour of a cell whose total error the localizer does not judge (:func:`judged`)."""
QUANTIZATION_BASE = "prepare"
"""The float model's stage (analysis.localize.FLOAT_STAGE), not imported: the report does
not load the chain."""
CAMERA_PAIR = ("compile", "board_sim")
"""The pair whose analysis stage is fed camera frames when board_sim has a camera."""

METRICS = (("cosine", "cosine"), ("max_qscale_diff", "max_qscale_diff (quantization steps)"))
"""The heatmaps: (layer_stats column, title)."""

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 12px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{width:150px}.missing,.alert{color:#a40;font-weight:bold}
.heatmaps{display:flex;flex-wrap:wrap;gap:28px}
table.heatmap td.cell{width:84px;text-align:center;cursor:pointer;font-size:12px}
table.heatmap td.cell.first{outline:4px solid #000;outline-offset:-4px;font-weight:bold}
table.heatmap th.first{background:#fdd}
.op{color:#777;font-size:11px}#detail{min-height:1.4em;font-family:monospace;margin:8px 0}
details{margin:4px 0}summary{cursor:pointer}
.legend span{display:inline-block;padding:2px 8px;margin-right:4px;border:1px solid #ddd}
"""

JS = """
document.querySelectorAll('td.cell').forEach(function (td) {
  td.addEventListener('click', function () {
    var d = td.dataset;
    document.getElementById('detail').textContent = d.layer + ' (' + d.op + ') at ' +
      d.stage + ' vs ' + d.base + ': cosine ' + d.cosine + ', max_qscale_diff ' + d.qdiff;
  });
});
"""


def esc(value: object) -> str:
    """Escape any value for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def fmt(value: object) -> str:
    """A table value as escaped text: floats to 4 significant digits, None as '-'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return esc(value)


def table(columns: list[tuple[str, str]], rows: list[dict], css: str = "") -> str:
    """An HTML table of ``rows`` with (key, heading) ``columns``; numbers right-aligned."""
    head = "".join(f"<th>{esc(label)}</th>" for _, label in columns)
    body = []
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key)
            num = isinstance(value, int | float) and not isinstance(value, bool)
            cells.append(f"<td{' class=num' if num else ''}>{fmt(value)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    cls = f' class="{esc(css)}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def judged(metric: str, row: dict | None, camera: bool = False) -> bool:
    """Whether the localizer judges this cell's total error. Not on the float -> calibrate
    pair (base ``prepare``: analysis.localize.FLOAT_STAGE), the quantization loss, whose
    totals carry every layer's rounding and clipping in every clean run: it is judged on
    each layer's own quantization cosine and the quantized input's cosine only. Nor, behind
    a ``camera``, on the steps of compile -> board_sim's layers: they inherit the input's
    allowed rounding, and each layer is judged on its own error (compile fed the board's
    input), the input against its modelled rounding."""
    if row is None:
        return True
    is_input = str(row.get("layer_id", "")).startswith("input:")
    if row.get("base_stage") == QUANTIZATION_BASE:
        return metric == "cosine" and is_input
    behind = camera and (row.get("base_stage"), row.get("analysis_stage")) == CAMERA_PAIR
    return not behind or metric == "cosine" or is_input


def severity(metric: str, row: dict | None, hm: Heatmap) -> float | None:
    """0 (clean) .. 0.5 (at the threshold) .. 1 (far past it) of a layer_stats ``row``; None
    if there is no value. Steps of a wide layer are judged as the localizer judges a total
    error (:func:`analysis.tolerance.total_limit`: int16 and int32 get their allowance), a
    layer with an allowance of its own (``hm.limits``: a camera input) by that."""
    value = row[metric] if row else None
    if value is None or math.isnan(value):
        return None
    t = hm.thresholds
    own = hm.limits.get((row.get("layer_id"), row.get("analysis_stage")))
    if metric == "cosine":
        err, limit = 1.0 - value, 1.0 - t.cosine
    elif own is not None:
        err, limit = value, own + EPS
    else:
        err = value
        limit = total_limit(t.max_qscale_diff, row.get("dtype"), row, row.get("scale") or 0.0)
    err = max(err, 0.0)
    if limit <= 0:
        return 0.0 if err == 0 else 1.0
    root = math.sqrt(err / limit)
    return 1.0 if math.isinf(root) else root / (1.0 + root)


def colour(s: float | None) -> str:
    """The CSS colour of a severity (grey when there is no value)."""
    if s is None:
        return "#e4e4e4"
    hue = HUE_CLEAN + (HUE_BAD - HUE_CLEAN) * s
    light = LIGHT_CLEAN + (LIGHT_BAD - LIGHT_CLEAN) * s
    return f"hsl({hue:.1f},75%,{light:.1f}%)"


def _cell(hm: Heatmap, metric: str, layer: dict, base: str, stage: str) -> str:
    row = hm.cells.get((layer["layer_id"], stage))
    value = row[metric] if row else None
    first = hm.first == (stage, layer["layer_id"])
    attrs = {
        "layer": layer["layer_id"], "op": layer["op_type"], "stage": stage, "base": base,
        "cosine": fmt(row["cosine"]) if row else "-",
        "qdiff": fmt(row["max_qscale_diff"]) if row else "-",
    }  # fmt: skip
    data = " ".join(f'data-{k}="{esc(v)}"' for k, v in attrs.items())
    text = "-" if value is None else (f"{value:.5f}" if metric == "cosine" else f"{value:.3g}")
    mark = " &#9670;" if first else ""
    title = "first divergent layer" if first else f"{layer['layer_id']} at {stage}"
    return (
        f'<td class="cell{" first" if first else ""}" style="background:{_background(metric, row, hm)}" '
        f'title="{esc(title)}" {data}>{esc(text)}{mark}</td>'
    )


def _background(metric: str, row: dict | None, hm: Heatmap) -> str:
    camera = any(stage == CAMERA_PAIR[1] for _, stage in hm.limits)
    return colour(severity(metric, row, hm)) if judged(metric, row, camera) else NOT_JUDGED


def heatmap(hm: Heatmap, metric: str, title: str) -> str:
    """One layers x stages heatmap of ``metric``; the first divergent cell outlined."""
    heads = "".join(
        f'<th class="{"first" if hm.first and hm.first[0] == a else ""}">{esc(a)}'
        f'<br><span class="op">vs {esc(b)}</span></th>'
        for b, a in hm.pairs
    )
    rows = []
    for layer in hm.layers:
        cells = "".join(_cell(hm, metric, layer, b, a) for b, a in hm.pairs)
        label = f'{esc(layer["layer_id"])} <span class="op">{esc(layer["op_type"])}</span>'
        rows.append(f"<tr><th>{label}</th>{cells}</tr>")
    return (
        f'<div><h3>{esc(title)}</h3><table class="heatmap" id="heatmap-{esc(metric)}">'
        f"<thead><tr><th>layer</th>{heads}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _legend(hm: Heatmap) -> str:
    t = hm.thresholds
    marks = [(0.0, "clean"), (0.5, "at threshold"), (0.8, "past threshold"), (None, "no value")]
    spans = "".join(f'<span style="background:{colour(s)}">{esc(text)}</span>' for s, text in marks)
    spans += f'<span style="background:{NOT_JUDGED}">total not judged (own errors are)</span>'
    first = (
        f"first divergent cell (&#9670;, outlined): layer {esc(hm.first[1])} at {esc(hm.first[0])}"
        if hm.first
        else "no divergent layer"
    )
    limits = (
        f"thresholds: cosine &ge; {fmt(t.cosine)}, max_qscale_diff &le; {fmt(t.max_qscale_diff)}"
    )
    return f'<p class="legend">{spans}</p><p>{limits}; {first}. Click a cell for its values.</p>'


CHAIN_COLUMNS = [
    ("stage", "stage"), ("status", "status"), ("duration_s", "duration (s)"),
    ("cache_hit", "cache hit"), ("metric", "metric"), ("value", "value"),
    ("change", "change vs previous"),
    ("n_samples", "samples"),
]  # fmt: skip
LOCALIZATION_COLUMNS = [
    ("kind", "kind"), ("rank", "rank"), ("stage", "stage"), ("base_stage", "vs"),
    ("layer_id", "layer"), ("op_type", "op"), ("metric", "metric"), ("value", "value"),
    ("threshold", "threshold"), ("detail", "detail"),
]  # fmt: skip
SENSITIVITY_COLUMNS = [
    ("analysis_stage", "stage"), ("base_stage", "reverted to"), ("rank", "rank"),
    ("layer_id", "layer"), ("op_type", "op"), ("topo_index", "topo"), ("target", "target"),
    ("metric", "metric"), ("before", "before"), ("after", "after"),
    ("improvement", "improvement"),
]  # fmt: skip
BADCASE_COLUMNS = [
    ("analysis_stage", "stage"), ("base_stage", "vs"), ("metric", "metric"), ("rank", "rank"),
    ("sample_id", "sample"), ("value", "value"), ("label", "label"),
    ("base_pred", "base pred"), ("analysis_pred", "analysis pred"),
]  # fmt: skip
NO_ANALYSIS = (
    '<p class="missing">This run has no analysis tables (layer_stats, localization): '
    "run <code>qparity localize {run}</code> to compare its stages.</p>"
)


def _section(title: str, body: str, empty: str) -> str:
    return f"<h2>{esc(title)}</h2>{body or f'<p>{esc(empty)}</p>'}"


def _summary(data: ReportData) -> str:
    """One sentence: the first divergent stage and layer, or that nothing diverges."""
    stage = next((r for r in data.localization if r["kind"] == "stage" and r["rank"] == 1), None)
    if stage is None:
        return "<p>No stage diverges.</p>" if data.localization else ""
    layer = next((r for r in data.localization if r["kind"] == "layer"), None)
    text = f"First divergent stage: {stage['stage']} (vs {stage['base_stage']})"
    if layer:
        text += f"; first divergent layer: {layer['layer_id']} ({layer['op_type']})"
    return f'<p class="alert">{esc(text)}.</p>'


def _badcases(data: ReportData) -> str:
    """The bad cases, one collapsible block per stage pair; the divergent pair's open."""
    first = next((r for r in data.localization if r["kind"] == "stage" and r["rank"] == 1), None)
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in data.badcases:
        groups.setdefault((row["base_stage"], row["analysis_stage"]), []).append(row)
    blocks = []
    for (base, stage), rows in groups.items():
        is_open = (
            " open" if first and (first["base_stage"], first["stage"]) == (base, stage) else ""
        )
        worst = max(rows, key=lambda r: r["value"] if r["value"] is not None else -math.inf)
        head = f"{stage} vs {base}: {len(rows)} bad cases, worst sample {worst['sample_id']}"
        body = table(BADCASE_COLUMNS, rows)
        blocks.append(f"<details{is_open}><summary>{esc(head)}</summary>{body}</details>")
    return "".join(blocks)


def _links(links: list[tuple[str, str]]) -> str:
    items = "".join(f'<li><a href="{esc(href)}">{esc(label)}</a></li>' for label, href in links)
    return f"<ul>{items}</ul>" if items else ""


def render(data: ReportData) -> str:
    """The whole report page."""
    hm = data.heatmap
    maps = (
        f"{_legend(hm)}<div class=heatmaps>"
        + "".join(heatmap(hm, m, t) for m, t in METRICS)
        + '</div><p id="detail"></p>'
        if hm
        else NO_ANALYSIS.format(run=esc(data.run_id))
    )
    header = "".join(f"<tr><th>{esc(k)}</th><td>{fmt(v)}</td></tr>" for k, v in data.header)
    parts = [
        f"<h1>qparity report: {esc(data.run_id)}</h1>",
        f'<table class="kv">{header}</table>',
        _summary(data),
        _section("Chain: the primary metric per stage", table(CHAIN_COLUMNS, data.chain), "no stages"),
        f"<h2>Layers x stages (each stage against the one before it)</h2>{maps}",
        _section("Localization", table(LOCALIZATION_COLUMNS, data.localization) if data.localization else "", "no localization rows"),
        _section("Sensitive ops", table(SENSITIVITY_COLUMNS, data.sensitivity) if data.sensitivity else "", "no sensitivity rows (no stage diverges)"),
        _section("Bad cases", _badcases(data), "no bad cases"),
        _section("Vendor-style files", _links(data.links), "no vendor-style files in debug/"),
    ]  # fmt: skip
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>qparity report {esc(data.run_id)}</title><style>{CSS}</style></head>"
        f"<body>{''.join(parts)}<script>{JS}</script></body></html>\n"
    )
