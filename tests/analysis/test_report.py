"""The HTML report of a run of the tiny model with an injected fault (analysis/report.py)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from analysis.localize import FLOAT_STAGE
from analysis.report import Heatmap, _camera_limits, write_report
from analysis.report_html import QUANTIZATION_BASE, fmt, heatmap, judged, severity
from pipelines.flow import run_chain
from qparity.cli_report import report_command
from schemas.spec import parse_spec
from schemas.spec_sections import Thresholds
from schemas.store import Run, RunStore
from schemas.tables import read_run_table
from tests.conftest import tiny_spec_dict

FAULT = {"kind": "bias_drop", "layer": "conv2"}
NASTY_TAG = '<b onclick="x()">&amp;'


class _Page(HTMLParser):
    """The heatmap cells (their attributes), the links and every tag name of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.cells: list[dict] = []
        self.hrefs: list[str] = []
        self.tags: set[str] = set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "td" and "cell" in a.get("class", "").split():
            self.cells.append(a)
        if tag == "a":
            self.hrefs.append(a["href"])


def build_faulty_run(root: Path) -> Run:
    """A run of the tiny model whose convert stage drops the bias of ``FAULT['layer']``."""
    data = tiny_spec_dict(faults=[FAULT], tags={"owner": NASTY_TAG})
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return RunStore(root).open(result.run_id)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(store root, run, report path, html) of the faulty run."""
    root = tmp_path_factory.mktemp("runs")
    run = build_faulty_run(root)
    path = write_report(run)
    return root, run, path, path.read_text(encoding="utf-8")


def test_the_report_is_written_into_the_run_folder(built):
    _, run, path, text = built
    assert path == run.path("report.html")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")


def test_both_heatmaps_have_a_cell_per_layer_and_chain_pair(built):
    _, run, _, text = built
    pairs = [
        (r["base_stage"], r["stage"])
        for r in read_run_table(run, "localization")
        if r["kind"] == "stage"
    ]
    rows = read_run_table(run, "layer_stats")
    layers = {
        r["layer_id"]
        for r in rows
        if r["sample_id"] is None and (r["base_stage"], r["analysis_stage"]) in pairs
    }
    assert 'id="heatmap-cosine"' in text and 'id="heatmap-max_qscale_diff"' in text
    cells = _Page(text).cells
    assert len(cells) == 2 * len(layers) * len(pairs)
    assert {(c["data-base"], c["data-stage"]) for c in cells} == set(pairs)


def test_heatmap_rows_follow_the_topological_order(built):
    _, run, _, text = built
    agg = [r for r in read_run_table(run, "layer_stats") if r["sample_id"] is None]
    order = {r["layer_id"]: r["topo_index"] for r in agg}
    cells = _Page(text).cells
    first_map = cells[: len(cells) // 2]
    seen = list(dict.fromkeys(c["data-layer"] for c in first_map))
    assert seen == sorted(seen, key=lambda lid: (order[lid], lid))


def test_the_first_divergent_cell_is_marked_in_both_heatmaps(built):
    _, _, _, text = built
    marked = [c for c in _Page(text).cells if "first" in c["class"].split()]
    assert [(c["data-stage"], c["data-layer"]) for c in marked] == [("convert", FAULT["layer"])] * 2
    assert "first divergent layer: conv2" in text


def test_the_chain_shows_top1_per_stage(built):
    _, run, _, text = built
    top1 = [r for r in read_run_table(run, "metrics") if r["metric"] == "top1"]
    assert top1
    for r in top1:
        assert re.search(rf"<td>{r['stage']}</td>.*?<td class=num>{fmt(r['value'])}</td>", text)


def test_run_strings_are_escaped(built):
    _, _, _, text = built
    assert NASTY_TAG not in text
    assert "owner=&lt;b onclick=&quot;x()&quot;&gt;&amp;amp;" in text
    assert "b" not in _Page(text).tags  # the tag value never became an element


def test_the_page_is_self_contained(built):
    _, _, _, text = built
    assert not re.search(r"https?://", text)
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=", text)


def test_links_point_to_existing_vendor_files(built, tmp_path):
    _, run, path, text = built
    hrefs = _Page(text).hrefs
    names = {Path(h).name for h in hrefs}
    assert {"compare_per_layer_out.txt", "badcase.txt", "abnormal_layer_advisor.txt"} <= names
    assert "output_convert_l1_sensitive_ops.txt" in names
    assert all((path.parent / h).is_file() for h in hrefs)
    elsewhere = write_report(run, tmp_path / "sub" / "r.html")
    moved = _Page(elsewhere.read_text()).hrefs
    assert len(moved) == len(hrefs) and all((elsewhere.parent / h).is_file() for h in moved)


def _section(text: str, title: str) -> str:
    return text.split(f"<h2>{title}</h2>", 1)[1].split("<h2>", 1)[0]


def test_sensitive_ops_and_bad_cases_are_listed(built):
    _, run, _, text = built
    sensitive = read_run_table(run, "sensitivity")
    assert sensitive and _section(text, "Sensitive ops").count("<tr>") == len(sensitive) + 1
    bad = read_run_table(run, "badcases")
    blocks = _section(text, "Bad cases")
    pairs = {(r["base_stage"], r["analysis_stage"]) for r in bad}
    assert blocks.count("<details") == len(pairs) and blocks.count("<tr>") == len(bad) + len(pairs)
    assert (
        blocks.count("<details open>") == 1
        and "<details open><summary>convert vs export:" in blocks
    )


def test_a_run_without_analysis_tables_says_so(tmp_path):
    run = RunStore(tmp_path).create_run("bare", "", "0" * 64, "v0", {}, {})
    text = write_report(run).read_text()
    assert "no analysis tables" in text and "heatmap-cosine" not in text


def test_the_command_prints_the_path_it_wrote(built, tmp_path):
    root, run, _, _ = built
    app = typer.Typer()
    app.command("report")(report_command)
    app.command("noop")(lambda: None)  # two commands: the run id stays an argument
    out = tmp_path / "cli.html"
    result = CliRunner().invoke(app, ["report", run.run_id, "--runs", str(root), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out) and out.is_file()


def _stats(dtype: str, qdiff: float, scale: float, top: float) -> dict:
    """An aggregate layer_stats row: max |base| = ``top``."""
    return {"dtype": dtype, "max_qscale_diff": qdiff, "scale": scale, "cosine": 1.0,
            "base_min": -top, "base_max": top}  # fmt: skip


def test_wide_layers_of_a_clean_run_are_not_red():
    """Clean runs: digits' int16 gate is 221 of its steps off (under one int8 step of its
    range), the tiny model's int32 conv2 127 (its range is 391 int8 steps of 1/127)."""
    hm = Heatmap(pairs=[], layers=[], cells={}, first=None, thresholds=Thresholds())
    clean = [_stats("int16", 221.0, 1e-4, 32767e-4), _stats("int32", 127.0, 1.3e-5, 0.646)]
    assert all(severity("max_qscale_diff", row, hm) < 0.5 for row in clean)
    faulty = [_stats("int16", 2000.0, 1e-4, 32767e-4), _stats("int32", 1e4, 1.3e-5, 0.646)]
    assert all(severity("max_qscale_diff", row, hm) > 0.5 for row in faulty)
    assert severity("max_qscale_diff", _stats("int8", 221.0, 0.01, 1.27), hm) > 0.9


def _hue(cell_html: str) -> float | None:
    """The HSL hue of a rendered cell's background (None: not an error colour)."""
    found = re.search(r"background:hsl\(([\d.]+),", cell_html)
    return float(found.group(1)) if found else None


def test_the_quantization_loss_column_is_not_red_in_a_clean_run():
    """float -> calibrate carries every layer's rounding and clipping (the tiny model's clean
    run: 26.7 steps at conv): the localizer judges that pair on own cosines and the quantized
    input only, so its totals are not coloured as errors; later pairs still are."""
    loss = {**_stats("int8", 26.7, 0.01, 1.27), "cosine": 0.9981, "layer_id": "conv",
            "base_stage": "prepare", "analysis_stage": "calibrate"}  # fmt: skip
    later = {**loss, "base_stage": "calibrate", "analysis_stage": "pre_export"}
    layer = {"layer_id": "conv", "op_type": "conv", "topo_index": 0}
    for metric in ("cosine", "max_qscale_diff"):
        for pairs, row in (
            ([("prepare", "calibrate")], loss),
            ([("calibrate", "pre_export")], later),
        ):
            cells = {("conv", pairs[0][1]): row}
            hm = Heatmap(
                pairs=pairs, layers=[layer], cells=cells, first=None, thresholds=Thresholds()
            )
            hue = _hue(heatmap(hm, metric, "t"))
            assert (hue is None) if row is loss else (hue is not None and hue < 65), (metric, row)
    quantized_input = {**loss, "layer_id": "input:x", "cosine": 0.9}
    assert judged("cosine", quantized_input) and not judged("max_qscale_diff", quantized_input)
    assert QUANTIZATION_BASE == FLOAT_STAGE


def test_a_camera_input_is_coloured_against_its_modelled_rounding():
    """An RGB model behind a BT.601 video-range yuv444 camera: the colour round trip moves
    the int8 input by up to 3 steps in clean runs; 2 steps is clean, 12 is not."""
    spec = parse_spec(
        tiny_spec_dict(
            data={**tiny_spec_dict()["data"], "input_format": "rgb", "mean": [127.5] * 3,
                  "std": [127.5] * 3},
            stages={"board_sim": {"runtime_format": "yuv444", "color": "bt601_video"}},
        ),
        "s.yaml",
    )  # fmt: skip
    row = {**_stats("int8", 2.0, 1 / 127.5, 1.0), "layer_id": "input:x",
           "base_stage": "compile", "analysis_stage": "board_sim"}  # fmt: skip
    hm = Heatmap(pairs=[], layers=[], cells={}, first=None, thresholds=Thresholds(),
                 limits=_camera_limits(spec, [row]))  # fmt: skip
    assert hm.limits[("input:x", "board_sim")] == pytest.approx(3.0)
    assert severity("max_qscale_diff", row, hm) < 0.5
    assert severity("max_qscale_diff", {**row, "max_qscale_diff": 12.0}, hm) > 0.6


def test_behind_a_camera_the_board_layers_totals_are_not_coloured():
    """A clean yuv444 camera run of examples/colour: board_sim's body.relu is 2 steps off
    compile's (inherited from the input's allowed one-step rounding; its own error is 0):
    not coloured past the threshold; the camera input itself still is judged."""
    relu = {**_stats("int8", 2.0, 0.01, 1.27), "layer_id": "body.relu",
            "base_stage": "compile", "analysis_stage": "board_sim"}  # fmt: skip
    layer = {"layer_id": "body.relu", "op_type": "relu", "topo_index": 0}
    pairs, cells = [("compile", "board_sim")], {("body.relu", "board_sim"): relu}
    camera = Heatmap(pairs=pairs, layers=[layer], cells=cells, first=None,
                     thresholds=Thresholds(), limits={("input:x", "board_sim"): 1.0})  # fmt: skip
    assert _hue(heatmap(camera, "max_qscale_diff", "t")) is None
    featuremap = Heatmap(
        pairs=pairs, layers=[layer], cells=cells, first=None, thresholds=Thresholds()
    )
    assert _hue(heatmap(featuremap, "max_qscale_diff", "t")) < 65
    assert judged("max_qscale_diff", {**relu, "layer_id": "input:x"}, camera=True)
