"""A model returning a dict of heads (boxes, and class scores nested in a tuple) through all
seven stages: every output is measured at every stage under its canonical id, top1 only on
the output compare.output names; `qparity sql` gives metrics by stage and output;
`qparity localize` says which output it judged."""

from __future__ import annotations

import pytest
import yaml

from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
from tests.conftest import cli_exit_code, tiny_spec_dict

SEVEN = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]
OUTPUTS = {"output.boxes", "output.scores.0"}


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(
        model={"factory": "tests.models:dict_heads"},
        data={**tiny_spec_dict()["data"], "dataset": "tests.models:two_head_data"},
        compare={**tiny_spec_dict()["compare"], "output": "output.scores.0"},
    )
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return root, RunStore(root).open(result.run_id)


def test_every_output_is_measured_at_every_stage(heads):
    _, run = heads
    rows = read_run_table(run, "metrics")
    assert run.manifest().status == "complete"
    for stage in ["float", *SEVEN]:
        mine = {(r["output"], r["metric"]): r["value"] for r in rows
                if r["stage"] == stage and r["output"]}  # fmt: skip
        assert {o for o, _ in mine} == OUTPUTS, stage
        assert mine[("output.boxes", "cosine")] > 0.99, stage
        assert ("output.scores.0", "top1") in mine and ("output.boxes", "top1") not in mine
    by = {(r["stage"], r["output"], r["metric"]): r["value"] for r in rows}
    for oid in OUTPUTS:  # convert -> compile -> board_sim are bit-exact on every output
        assert by[("board_sim", oid, "cosine")] == by[("convert", oid, "cosine")]


def test_sql_gives_metrics_by_stage_and_output(heads, monkeypatch, capsys):
    root, run = heads
    sql = (f"SELECT stage, output, round(value, 2) AS cosine FROM metrics WHERE run_id = "
           f"'{run.run_id}' AND metric = 'cosine' ORDER BY stage, output")  # fmt: skip
    assert cli_exit_code(monkeypatch, "sql", sql, "--runs", root, "--format", "csv") == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header == '"stage","output","cosine"' and len(lines) == 2 * 8
    assert {line.split(",")[1].strip('"') for line in lines} == OUTPUTS


def test_localize_says_which_output_it_judged(heads, monkeypatch, capsys):
    root, run = heads
    assert cli_exit_code(monkeypatch, "localize", run.run_id, "--runs", root) == 0
    out = capsys.readouterr().out
    assert "no stage diverges" in out and "judged by top-1 of output.scores.0" in out
