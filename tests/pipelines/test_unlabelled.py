"""A dataset without labels ({"inputs": {"x": ...}, "labels": None}) through all seven
stages: every stage records its agreement with the float model, localization judges by
the output cosine, `qparity sql` gives metrics by stage; bad labels stop the run before
any stage is complete."""

from __future__ import annotations

import pytest
import yaml

from pipelines.flow import run_chain
from schemas.errors import StageError
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
from tests.conftest import cli_exit_code, tiny_spec_dict

SEVEN = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]
AGREEMENT = {"cosine", "sqnr_db", "l1", "top1_agreement"}


def _spec(dataset: str, **sections) -> dict:
    return tiny_spec_dict(data={**tiny_spec_dict()["data"], "dataset": dataset}, **sections)


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = _spec("tests.models:unlabelled_data")
    data["data"]["metric"] = "tests.stages.test_evaluate:miou"  # a task metric, plugged in
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return root, RunStore(root).open(result.run_id)


def test_every_stage_records_agreement_with_the_float_model_and_no_top1(unlabelled):
    _, run = unlabelled
    rows = read_run_table(run, "metrics")
    by_stage = {}
    for r in rows:
        by_stage.setdefault(r["stage"], {})[r["metric"]] = r["value"]
    assert set(SEVEN) <= set(by_stage) and run.manifest().status == "complete"
    for stage in ["float", *SEVEN]:
        assert set(by_stage[stage]) >= AGREEMENT, stage
    assert not [r for r in rows if r["metric"] == "top1"]
    task = [r for r in rows if r["metric"] == "miou"]
    assert {r["stage"] for r in task} == {"float", *SEVEN} and {r["output"] for r in task} == {None}
    assert by_stage["compile"]["miou"] == by_stage["compile"]["top1_agreement"]
    assert by_stage["float"]["cosine"] == 1.0 and by_stage["compile"]["cosine"] > 0.99
    # convert -> compile -> board_sim are bit-exact: the same metrics
    assert by_stage["board_sim"] == {k: by_stage["convert"][k] for k in by_stage["board_sim"]}


def test_localize_judges_it_by_the_output_cosine(unlabelled, monkeypatch, capsys):
    root, run = unlabelled
    stages = [r for r in read_run_table(run, "localization") if r["kind"] == "stage"]
    assert [r["stage"] for r in stages] == SEVEN[1:]
    bad = read_run_table(run, "badcases")
    assert bad and {r["label"] for r in bad} == {None}  # no labels: none invented
    assert "| - |" in run.path("debug/badcase.txt").read_text()
    assert cli_exit_code(monkeypatch, "localize", run.run_id, "--runs", root) == 0
    assert "no stage diverges" in capsys.readouterr().out


def test_sql_gives_metrics_by_stage(unlabelled, monkeypatch, capsys):
    """The README's stage x metric PIVOT: one row per stage, one column per metric."""
    root, run = unlabelled
    sql = (f"PIVOT (SELECT stage, metric, value FROM metrics WHERE run_id = '{run.run_id}' "
           "AND output = 'output') ON metric USING first(value) ORDER BY stage")  # fmt: skip
    assert cli_exit_code(monkeypatch, "sql", sql, "--runs", root, "--format", "csv") == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header == '"stage","cosine","l1","sqnr_db","top1_agreement"'
    assert [line.split(",")[0].strip('"') for line in lines] == sorted(["float", *SEVEN])


def test_labels_out_of_range_stop_the_run_before_any_stage_is_complete(tmp_path):
    data = _spec("tests.catalog.cases_contract:labels_out_of_range")
    with pytest.raises(StageError, match="sample 7 of split 'train'"):
        run_chain(parse_spec(data, "t"), yaml.safe_dump(data), tmp_path, use_prefect=False)
    (m,) = RunStore(tmp_path).list_runs()
    assert m.status == "failed"
    assert not [s for s, rec in m.stages.items() if rec.status == "complete"]


def test_show_and_the_report_give_the_cosine_per_stage(unlabelled, monkeypatch, capsys):
    from analysis.report import gather

    root, run = unlabelled
    assert cli_exit_code(monkeypatch, "show", run.run_id, "--runs", root, "-q") == 0
    assert capsys.readouterr().out.startswith(f"{run.run_id} complete board_sim cosine 0.99")
    chain = {r["stage"]: r for r in gather(run, root).chain}
    assert chain["convert"]["metric"] == "cosine" and chain["float"]["value"] == 1.0
