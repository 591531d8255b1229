"""Analysis of whole runs of the tiny model: a clean run and runs with injected faults."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from analysis.compare import OUTPUT, PairResult
from analysis.layer_graph import Layer
from analysis.localize import PairVerdict, judge_pair, triage
from analysis.own_error import OwnErrors
from pipelines.flow import run_chain
from schemas.errors import SpecError
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
from stages.stage_models import StageModel
from tests.conftest import tiny_spec_dict


def _run(root, **sections):
    data = tiny_spec_dict(**sections)
    return run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def clean(store):
    return _run(store)


def test_a_clean_run_has_no_divergent_stage(clean, store):
    a = clean.analysis
    assert a.first is None and "no stage diverges" in a.summary()
    run = RunStore(store).open(clean.run_id)
    stages = [r for r in read_run_table(run, "localization") if r["kind"] == "stage"]
    assert [r["stage"] for r in stages] == a.chain[1:] and all(r["rank"] == 0 for r in stages)


def test_layer_stats_hold_sample_rows_and_aggregates(clean, store):
    run = RunStore(store).open(clean.run_id)
    rows = read_run_table(run, "layer_stats")
    pair = [r for r in rows if (r["base_stage"], r["analysis_stage"]) == ("export", "convert")]
    aggregates = [r for r in pair if r["sample_id"] is None]
    samples = {r["sample_id"] for r in pair if r["sample_id"] is not None}
    assert samples == set(range(64))  # every evaluation sample
    assert len(aggregates) == len({r["layer_id"] for r in pair})
    convert_vs_compile = [
        r for r in rows if r["analysis_stage"] == "compile" and r["base_stage"] == "convert"
    ]
    assert all(r["exact_ratio"] == 1.0 for r in convert_vs_compile)


def test_vendor_files_are_written(clean, store):
    debug = RunStore(store).open(clean.run_id).path("debug")
    header = (debug / "compare_per_layer_out.txt").read_text().splitlines()[0]
    assert header.startswith("mod_name | base_op_type | analy_op_type")
    assert (debug / "compare_per_layer_out.csv").read_text().startswith("mod_name,")
    for col in ("shape", "KL", "Rtol", "base_var", "analy_var"):
        assert f" {col} |" in header
    assert (debug / "badcase.txt").exists() and (debug / "abnormal_layer_advisor.txt").exists()


@pytest.mark.parametrize(
    "fault, stage",
    [
        ({"kind": "bias_drop", "layer": "conv2"}, "convert"),
        ({"kind": "shift_off", "layer": "conv", "amount": -1}, "convert"),
    ],
)
def test_an_injected_fault_is_localized(store, fault, stage):
    result = _run(store, faults=[fault])
    first = result.analysis.first
    assert first is not None and first.analysis == stage
    assert first.first_layer == fault["layer"]
    assert fault["layer"] in [lid for lid, *_ in first.sensitive[:3]]
    assert f"stage/op problem at {fault['layer']}" in first.triage  # conv is the first layer
    run = RunStore(store).open(result.run_id)
    assert [r["layer_id"] for r in read_run_table(run, "faults")] == [fault["layer"]]
    layer_rows = [r for r in read_run_table(run, "localization") if r["kind"] == "layer"]
    assert [(r["stage"], r["layer_id"]) for r in layer_rows] == [(stage, fault["layer"])]
    assert read_run_table(run, "badcases") and read_run_table(run, "layer_tensors")
    ops = run.path(f"debug/output_{stage}_l1_sensitive_ops.txt").read_text().splitlines()
    row = next(r.split(" | ") for r in ops if r.startswith(f"{fault['layer']} |"))
    assert row[1] == "weight" and row[-1].endswith("%)") and int(row[-1].split("(")[0]) > 0


def test_a_fault_on_a_missing_layer_is_a_spec_error(store):
    with pytest.raises(SpecError, match="nothere"):
        _run(store, faults=[{"kind": "bias_drop", "layer": "nothere"}])


def test_a_fault_at_the_wrong_stage_is_refused():
    with pytest.raises(SpecError, match="belongs to stage convert"):
        parse_spec(
            tiny_spec_dict(faults=[{"kind": "bias_drop", "stage": "compile", "layer": "conv"}]), "t"
        )


def test_with_qat_fine_tuning_the_qat_model_is_the_reference(store):
    result = _run(store, stages={"qat": {"enabled": True, "steps": 2}})
    assert result.analysis.chain[0] == "qat" and "calibrate" not in result.analysis.chain
    assert result.analysis.first is None


LAYERS = ["input:x", "conv", "relu", "head"]
DTYPES = {"input:x": "int8", "conv": "int8", "relu": "int8", "head": "int32"}


def _triage(total: dict[str, float], own: dict[str, float], first: str, exact=True) -> str:
    """The triage of a convert pair whose layers have these total and own errors (steps)."""
    result = PairResult("export", "convert", layer_ids=LAYERS)
    result.aggregates = {lid: {"max_qscale_diff": total.get(lid, 0.0)} for lid in LAYERS}
    steps = {lid: own.get(lid, 0.0) for lid in LAYERS[1:]}
    v = PairVerdict("export", "convert", reasons=["x"], tolerance=1.0, first_layer=first)
    v.own = OwnErrors(steps, {}, exact)
    return triage(result, v, DTYPES)


def test_triage_blames_a_first_layer_that_adds_error_of_its_own():
    got = _triage({"conv": 19, "relu": 19, "head": 9e3}, {"conv": 19}, "conv")
    assert "stage/op problem at conv" in got and "input" not in got


def test_triage_blames_an_output_layer_that_adds_error_of_its_own():
    got = _triage({"head": 2e4}, {"head": 2e4}, "head")
    assert "stage/op problem at head" in got and "post-processing" not in got


def test_triage_sends_inherited_errors_to_the_input():
    assert "check the input data" in _triage({"input:x": 3, "conv": 5}, {}, "conv")
    assert "check the input data" in _triage({"conv": 5, "relu": 5}, {"conv": 0.5}, "conv")


def test_triage_without_any_layer_off_is_post_processing():
    assert "post-processing" in _triage({}, {"relu": 0.5}, "relu")


def test_triage_without_exact_own_errors_names_the_first_layer_off():
    got = _triage({"relu": 4, "head": 9e3}, {"relu": 4, "head": 9e3}, "relu", exact=False)
    assert got.startswith("relu is the first layer off")


def _fixed(values: dict[str, float], out: float, substitutable: bool) -> StageModel:
    """A stage model whose every layer and output is a constant, whatever it is fed."""

    def run(idx, replace):
        n = len(idx)
        return np.full((n, 10), out), {k: np.full((n, 4), v) for k, v in values.items()}

    return StageModel("x", run, substitutable=substitutable)


def test_sensitive_ops_rank_layers_of_any_dtype_in_int8_steps(make_ctx):
    """convert -> compile (simulator: estimated sensitivity): the int8 conv adds 2 of its
    steps, the int32 head 40 of its far finer ones (0.1 int8 step of its range)."""
    steps = {"conv": 0.01, "head": 1.3e-5}
    result = PairResult("convert", "compile", layer_ids=["conv", "head"], steps=steps)
    result.aggregates = {
        "conv": {"base_min": 0.0, "base_max": 1.27, "max_qscale_diff": 2.0},
        "head": {"base_min": -0.6, "base_max": 0.6, "max_qscale_diff": 40.0},
        OUTPUT: {"cosine": 0.5},
    }
    models = {
        "convert": _fixed({"conv": 0.0, "head": 0.0}, 0.0, substitutable=True),
        "compile": _fixed({"conv": 0.02, "head": 40 * 1.3e-5}, 1.0, substitutable=False),
    }
    dtypes = {"conv": "int8", "head": "int32"}
    v = judge_pair(make_ctx(), models, result, {}, np.arange(3), dtypes)
    assert v.first_layer == "conv"
    assert [lid for lid, *_ in v.sensitive] == ["conv", "head"]


def test_sensitive_ops_from_total_errors_rank_where_the_error_enters(make_ctx):
    """compile -> board_sim, both programs: only total errors are known; relu's is all
    the conv's (5 steps, through conv2), the head's the conv's plus 1 of its own."""
    ids = ["conv", "relu", "head"]
    result = PairResult("compile", "board_sim", layer_ids=ids, steps=dict.fromkeys(ids, 0.01))
    totals = {"conv": 5.0, "relu": 5.0, "head": 6.0}
    result.aggregates = {lid: {"base_min": -1.0, "base_max": 1.0, "max_qscale_diff": t}
                         for lid, t in totals.items()} | {OUTPUT: {"cosine": 0.5}}  # fmt: skip
    models = {
        "compile": _fixed(dict.fromkeys(ids, 0.0), 0.0, substitutable=False),
        "board_sim": _fixed({k: t * 0.01 for k, t in totals.items()}, 1.0, substitutable=False),
    }
    layers = {
        "conv": Layer("conv", "conv", 0, ("input:x",)),
        "conv2": Layer("conv2", "conv", 1, ("conv",)),  # fused with relu: not captured
        "relu": Layer("relu", "relu", 2, ("conv2",)),
        "head": Layer("head", "linear", 3, ("relu",)),
    }
    dtypes = dict.fromkeys(ids, "int8")
    v = judge_pair(make_ctx(), models, result, {}, np.arange(3), dtypes, layers)
    assert v.first_layer == "conv"
    assert [lid for lid, *_ in v.sensitive][:2] == ["conv", "head"]
