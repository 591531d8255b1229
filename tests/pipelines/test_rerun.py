"""qparity rerun: one stage again from its cached upstream, then re-localized."""

from __future__ import annotations

import pytest
import yaml

from pipelines.flow import run_chain
from pipelines.rerun import localization_side_by_side, rerun
from schemas.errors import SpecError
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import write_rows
from tests.conftest import tiny_spec_dict


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(faults=[{"kind": "bias_drop", "layer": "conv2"}])
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return root, result


def test_rerun_reuses_upstream_and_recomputes_the_stage(faulted):
    root, parent = faulted
    child = rerun(root, parent.run_id, "convert", ["faults=[]"], use_prefect=False)
    hits = {name: o.cache_hit for name, o in child.outcomes.items()}
    assert hits == {
        "prepare": True, "calibrate": True, "pre_export": True, "export": True, "convert": False
    }  # fmt: skip
    assert RunStore(root).open(child.run_id).manifest().parent_run == parent.run_id
    assert parent.analysis.first.analysis == "convert" and child.analysis.first is None
    rows = localization_side_by_side(root, parent.run_id, child.run_id)
    convert = next(r for r in rows if r["rank"] == "export->convert")
    assert convert["parent"].startswith("DIVERGES") and convert["rerun"].startswith("ok")
    layer = next(r for r in rows if r["kind"] == "layer")
    assert layer["parent"].startswith("convert conv2") and "rerun" not in layer


def test_rerun_with_downstream_runs_the_rest_and_recomputes_even_when_cached(faulted):
    root, parent = faulted
    child = rerun(root, parent.run_id, "compile", [], downstream=True, use_prefect=False)
    assert list(child.outcomes)[-2:] == ["compile", "board_sim"]
    assert not child.outcomes["compile"].cache_hit and child.outcomes["convert"].cache_hit


def test_rerun_of_a_stage_outside_the_chain_is_a_spec_error(faulted):
    root, parent = faulted
    with pytest.raises(SpecError, match="qat"):
        rerun(root, parent.run_id, "qat", [], use_prefect=False)
    with pytest.raises(SpecError, match="unknown stage"):
        rerun(root, parent.run_id, "nope", [], use_prefect=False)


def _loc(run_id: str, kind: str, rank: int, stage: str, base: str, layer=None) -> dict:
    return {
        "run_id": run_id, "kind": kind, "rank": rank, "stage": stage, "base_stage": base,
        "layer_id": layer, "op_type": None, "metric": None, "value": 1.0, "threshold": 1.0,
        "detail": None,
    }  # fmt: skip


def test_side_by_side_rows_are_in_chain_order_and_numeric_rank_order(tmp_path):
    store = RunStore(tmp_path)
    runs = [store.create_run("t", "", "0" * 64, "v0", {}, {}) for _ in range(2)]
    for run in runs:
        rid = run.run_id
        rows = [_loc(rid, "stage", 0, s, b) for b, s in
                (("export", "convert"), ("convert", "compile"), ("compile", "board_sim"))]  # fmt: skip
        rows += [_loc(rid, "sensitive", i, "convert", "export", f"l{i}") for i in range(1, 12)]
        write_rows(run, "localization", rows, "all")
    got = localization_side_by_side(tmp_path, runs[0].run_id, runs[1].run_id)
    assert [r["rank"] for r in got] == [
        "export->convert", "convert->compile", "compile->board_sim", *range(1, 12)
    ]  # fmt: skip
