"""The stage registry as a DAG: what runs for stages.run, stop_after, qat and named pipelines."""

import pytest

from schemas.errors import SpecError
from schemas.spec import parse_spec
from stages.registry import plan
from tests.conftest import tiny_spec_dict


def _plan(**sections) -> list[tuple[str, str | None]]:
    return [(s.name, up and up.name) for s, up in plan(parse_spec(tiny_spec_dict(**sections), "t"))]


def test_the_default_plan_is_the_chain_with_each_stage_fed_by_the_one_before():
    got = _plan()
    names = [n for n, _ in got]
    assert names == [
        "prepare",
        "calibrate",
        "pre_export",
        "export",
        "convert",
        "compile",
        "board_sim",
    ]
    assert got[2] == ("pre_export", "calibrate")


def test_qat_when_enabled_feeds_pre_export():
    assert ("pre_export", "qat") in _plan(stages={"qat": {"enabled": True}})


def test_run_selects_stages_and_everything_they_need():
    assert [n for n, _ in _plan(stages={"run": ["export"]})] == [
        "prepare", "calibrate", "pre_export", "export"
    ]  # fmt: skip
    assert [n for n, _ in _plan(stages={"run": ["export"], "stop_after": "calibrate"})] == [
        "prepare", "calibrate"
    ]  # fmt: skip


def test_running_a_disabled_stage_is_a_spec_error():
    with pytest.raises(SpecError, match="stages.run: stage qat is not enabled"):
        _plan(stages={"run": ["qat"]})


def test_named_pipelines_are_fragments_the_spec_overrides():
    assert [n for n, _ in _plan(pipeline="to_convert")][-1] == "convert"
    spec = parse_spec(tiny_spec_dict(pipeline="stages_only", compare={"probe_samples": 2}), "t")
    assert spec.compare.enabled is False and spec.compare.probe_samples == 2
    with pytest.raises(SpecError, match="unknown named pipeline 'nope'.*qat_chain"):
        parse_spec(tiny_spec_dict(pipeline="nope"), "t")
