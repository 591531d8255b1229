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


@pytest.fixture
def code_copy(tmp_path, monkeypatch):
    """A copy of the product code; code_version() digests it instead of the checkout."""
    import shutil
    from pathlib import Path

    from stages import registry

    repo = Path(registry.__file__).resolve().parent.parent
    for pkg in ("schemas", "simulator", "stages"):
        shutil.copytree(repo / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(registry, "__file__", str(tmp_path / "stages" / "registry.py"))
    registry.code_version.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    registry.code_version.cache_clear()


def _edited_version(root, rel: str) -> str:
    from stages import registry

    path = root / rel
    path.write_bytes(path.read_bytes() + b"\n/* edited */\n")
    registry.code_version.cache_clear()
    return registry.code_version()


@pytest.mark.parametrize("rel", ["simulator/csrc/qconv.c", "simulator/csrc/qsimd.h"])
def test_editing_a_c_source_changes_the_code_version_of_the_stage_cache_key(code_copy, rel):
    from stages.registry import code_version

    before = code_version()
    assert _edited_version(code_copy, rel) != before


def test_docs_are_not_part_of_the_code_version(code_copy):
    from stages.registry import code_version

    before = code_version()
    assert _edited_version(code_copy, "simulator/README.md") == before
