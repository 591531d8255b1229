"""Tests of the pipeline spec: loading, error messages, overrides, digests."""

from __future__ import annotations

import pytest

from schemas.errors import SpecError
from schemas.spec import (
    STAGE_CONFIG_PATHS,
    STAGE_NAMES,
    PipelineSpec,
    load_spec,
    parse_spec,
    spec_digest,
    stage_config_digest,
    with_overrides,
)

MINIMAL = """\
name: digits-cnn
model: {factory: examples.digits.model:build}
data: {dataset: examples.digits.data:load}
"""


def write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def minimal() -> PipelineSpec:
    return parse_spec(
        {"name": "m", "model": {"factory": "a.b:c"}, "data": {"dataset": "d:e"}}, "test"
    )


def test_minimal_spec_loads_with_defaults(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.name == "digits-cnn"
    assert spec.model.weights is None
    assert spec.data.calibration_samples == 256
    assert spec.data.input_format == "featuremap"
    assert spec.quant.march == "nash-e"
    assert spec.quant.consistency_level == "none"
    assert spec.quant.high_precision_output is True
    assert spec.stages.qat.enabled is False
    assert spec.stages.calibrate.batch_size == 64
    assert spec.compare.thresholds.cosine == 0.999
    assert spec.tags == {}


def test_full_spec_values(tmp_path):
    text = MINIMAL + (
        "quant: {consistency_level: 1, overrides: {head.fc: int16}, observer: percentile}\n"
        "stages: {stop_after: board-sim, qat: {enabled: true, steps: 5}}\n"
        "tags: {owner: platform, nightly: 3}\n"
    )
    spec = load_spec(write(tmp_path, text))
    assert spec.quant.consistency_level == 1
    assert spec.quant.overrides == {"head.fc": "int16"}
    assert spec.stages.stop_after == "board_sim"
    assert spec.stages.qat.steps == 5
    assert spec.tags == {"owner": "platform", "nightly": "3"}


def test_spec_is_frozen():
    with pytest.raises(Exception, match="frozen"):
        minimal().name = "other"


def test_misspelled_key_names_file_path_and_allowed_keys(tmp_path):
    path = write(tmp_path, MINIMAL + "quant: {obsrever: minmax}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: quant.obsrever: unknown key")
    assert "activation_dtype, averaging_constant, consistency_level" in msg
    assert "observer" in msg


def test_wrong_type_names_field_and_expectation(tmp_path):
    path = write(tmp_path, MINIMAL.replace("load}", "load, calibration_samples: many}"))
    with pytest.raises(SpecError, match=r"data\.calibration_samples: .*integer.*'many'"):
        load_spec(path)


def test_bad_literal_lists_choices(tmp_path):
    path = write(tmp_path, MINIMAL + "quant: {march: nash-x}\n")
    with pytest.raises(SpecError, match=r"quant\.march: .*'nash-e'.*got 'nash-x'"):
        load_spec(path)


def test_all_errors_reported_one_line_each(tmp_path):
    text = "name: '-bad'\nmodel: {factory: nocolon}\ndata: {dataset: d:e, batch_size: 0}\n"
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    lines = str(info.value).splitlines()
    assert "3 problems" in lines[0]
    assert any(line.strip().startswith("name:") for line in lines[1:])
    assert any("model.factory: expected 'module.path:function'" in line for line in lines)
    assert any("data.batch_size: input should be greater than 0" in line for line in lines)


@pytest.mark.parametrize("value", ["yes", "3", "null"])
def test_consistency_level_rejects_non_levels(value):
    data = minimal().model_dump(mode="json")
    data["quant"]["consistency_level"] = {"yes": True, "3": 3, "null": None}[value]
    with pytest.raises(SpecError, match="quant.consistency_level"):
        parse_spec(data, "x")


def test_missing_required_and_bad_stop_after():
    with pytest.raises(SpecError, match="data: required key is missing"):
        parse_spec({"name": "m", "model": {"factory": "a:b"}}, "x")
    data = minimal().model_dump(mode="json")
    data["stages"]["stop_after"] = "deploy"
    with pytest.raises(SpecError, match="stages.stop_after: expected one of: prepare"):
        parse_spec(data, "x")


def test_bad_yaml_gives_line(tmp_path):
    path = write(tmp_path, MINIMAL + "quant: {march: [unclosed\n")
    with pytest.raises(SpecError, match=r"spec\.yaml: not valid YAML at line \d+"):
        load_spec(path)


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(SpecError, match="nope.yaml: spec file not found"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="top level must be a mapping"):
        load_spec(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(SpecError, match="empty"):
        load_spec(write(tmp_path, ""))


def test_overrides_apply_and_parse_yaml_values():
    spec = with_overrides(
        minimal(),
        [
            "quant.rounding=bpu_round",
            "stages.qat.steps=5",
            "quant.consistency_level=none",
            "quant.overrides.head.fc=int16",
            "compare.thresholds.cosine=0.99",
        ],
    )
    assert spec.quant.rounding == "bpu_round"
    assert spec.stages.qat.steps == 5
    assert spec.quant.consistency_level == "none"
    assert spec.quant.overrides == {"head.fc": "int16"}
    assert spec.compare.thresholds.cosine == 0.99
    assert minimal().stages.qat.steps == 200  # the original is untouched


@pytest.mark.parametrize(
    ("setting", "key"),
    [("quant.rouding=bpu_round", "quant.rouding"), ("nope=1", "nope"), ("name.x=1", "name.x")],
)
def test_overrides_reject_unknown_paths(setting, key):
    with pytest.raises(SpecError, match=key.replace(".", r"\.")):
        with_overrides(minimal(), [setting])


def test_overrides_reject_bad_values_and_syntax():
    with pytest.raises(SpecError, match="stages.qat.steps"):
        with_overrides(minimal(), ["stages.qat.steps=-1"])
    with pytest.raises(SpecError, match="key=value"):
        with_overrides(minimal(), ["quant.rounding"])


def test_spec_digest_is_stable_and_sensitive():
    a, b = minimal(), minimal()
    assert spec_digest(a) == spec_digest(b)
    assert len(spec_digest(a)) == 64
    assert spec_digest(with_overrides(a, ["quant.march=nash-m"])) != spec_digest(a)
    assert spec_digest(with_overrides(a, ["quant.march=nash-e"])) == spec_digest(a)


def test_stage_digests_follow_the_table():
    base = minimal()
    qat = with_overrides(base, ["stages.qat.steps=7"])
    assert stage_config_digest(qat, "prepare") == stage_config_digest(base, "prepare")
    assert stage_config_digest(qat, "calibrate") == stage_config_digest(base, "calibrate")
    assert stage_config_digest(qat, "qat") != stage_config_digest(base, "qat")
    rounding = with_overrides(base, ["quant.rounding=bpu_round"])
    assert stage_config_digest(rounding, "prepare") != stage_config_digest(base, "prepare")
    assert stage_config_digest(rounding, "calibrate") != stage_config_digest(base, "calibrate")
    calib = with_overrides(base, ["data.calibration_samples=10"])
    assert stage_config_digest(calib, "prepare") == stage_config_digest(base, "prepare")
    assert stage_config_digest(calib, "calibrate") != stage_config_digest(base, "calibrate")
    evaluation = with_overrides(base, ["data.evaluation_samples=10"])
    assert stage_config_digest(evaluation, "calibrate") == stage_config_digest(base, "calibrate")
    assert set(STAGE_CONFIG_PATHS) <= set(STAGE_NAMES)
    board = with_overrides(base, ["stages.board_sim.runtime_format=nv12"])
    assert stage_config_digest(board, "compile") != stage_config_digest(base, "compile")
    assert stage_config_digest(board, "convert") == stage_config_digest(base, "convert")


def test_stage_digest_of_other_and_unknown_stages():
    assert len(stage_config_digest(minimal(), "convert")) == 64
    with pytest.raises(SpecError, match="unknown stage 'deploy'"):
        stage_config_digest(minimal(), "deploy")


def test_load_spec_can_start_from_a_named_pipeline(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(MINIMAL + "compare:\n  probe_samples: 3\n")
    spec = load_spec(path, pipeline="analysis_only")
    assert spec.stages.cached_only and spec.compare.enabled and spec.compare.probe_samples == 3
    assert not load_spec(path).stages.cached_only
    with pytest.raises(SpecError, match="unknown named pipeline 'nope'") as e:
        load_spec(path, pipeline="nope")
    assert "analysis_only" in str(e.value) and str(path) in str(e.value)


def test_a_task_metric_enters_every_stage_digest_and_names_a_primary():
    base = minimal()
    task = with_overrides(base, ["data.metric=seg.metrics:miou", "compare.primary=miou"])
    for stage in ("prepare", "convert", "board_sim"):
        assert stage_config_digest(task, stage) != stage_config_digest(base, stage)
    assert with_overrides(base, ["compare.primary=sqnr_db"]).compare.primary == "sqnr_db"


def test_a_primary_no_stage_records_is_refused_naming_the_field():
    with pytest.raises(SpecError, match="compare.primary: 'miou' is not a metric") as e:
        with_overrides(minimal(), ["compare.primary=miou"])
    assert "data.metric" in e.value.hint
    with pytest.raises(SpecError, match="compare.primary"):
        with_overrides(minimal(), ["compare.primary=top 1"])


def test_the_schema_models_build_without_reading_their_source():
    """``use_attribute_docstrings`` made pydantic find and parse every model's source at
    import (``inspect.findsource``, ~50 ms of `qparity show` start-up; bench/cli.py); no code
    reads the field descriptions it made: the docstrings are for readers of the source."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import inspect\n"
        "def refuse(*a, **k): raise AssertionError('source read')\n"
        "inspect.findsource = inspect.getsourcelines = refuse\n"
        "import schemas.manifest, schemas.artifacts, schemas.spec, schemas.spec_faults\n"
    )
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-500:]
