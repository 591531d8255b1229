"""Analysis of whole runs of the tiny model: a clean run and runs with injected faults."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import yaml

from analysis import ptq_analysis
from analysis.analyze import _reference, chain_pairs
from analysis.compare import OUTPUT, PairResult
from analysis.layer_graph import Layer
from analysis.localize import judge_pair
from analysis.primary import Primary
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
    quantization = {r["layer_id"] for r in rows if r["base_stage"] == "prepare"}
    assert {"conv", "head", "<output>"} <= quantization  # float -> calibrate is compared
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
    assert (debug / "badcase.txt").exists()
    advisor = (debug / "abnormal_layer_advisor.txt").read_text()  # the vendor's floatvscalib
    assert advisor.startswith("# rules on prepare -> calibrate") and "no abnormal layer" in advisor


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


def test_a_calibration_that_clips_names_calibrate_and_the_layer(store):
    """The quantization loss itself (float -> calibrate) is a compared pair: conv's scale
    cut to a quarter clips its outputs, and every later stage agrees with calibrate."""
    fault = {"kind": "calib_scale", "layer": "conv", "amount": -8}
    result = _run(store, faults=[fault])
    first = result.analysis.first
    assert (first.base, first.analysis, first.first_layer) == ("prepare", "calibrate", "conv")
    assert "lose more than cosine" in first.reasons[-1]
    assert "calibrate stage/op problem at conv" in first.triage
    assert "conv" in [lid for lid, *_ in first.sensitive[:3]]
    # the weight/activation split's sums: the quantization pair's candidates only
    assert set(first.own.parts) <= {lid for lid, *_ in first.sensitive} and first.own.parts
    assert all(not v.own.parts for v in result.analysis.verdicts if v is not first)
    ops = RunStore(store).open(result.run_id).path("debug/output_calibrate_l1_sensitive_ops.txt")
    row = next(r.split(" | ") for r in ops.read_text().splitlines() if r.startswith("conv |"))
    assert row[1] == "activation"  # its output scale clips, not its weights


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
    pairs = [(v.base, v.analysis) for v in result.analysis.verdicts]
    assert pairs[:2] == [("prepare", "calibrate"), ("qat", "pre_export")]
    assert result.analysis.first is None


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
    v = judge_pair(make_ctx(), models, result, _top1({}), np.arange(3), dtypes)
    assert v.first_layer == "conv"
    assert [lid for lid, *_ in v.sensitive] == ["conv", "head"]


def _total_errors_pair(ids: list[str], totals: dict[str, float]):
    """compile -> board_sim, both programs (not substitutable): each layer's total error
    ``totals`` in steps of 0.01, the output's cosine 0.5."""
    result = PairResult("compile", "board_sim", layer_ids=ids, steps=dict.fromkeys(ids, 0.01))
    result.aggregates = {lid: {"base_min": -1.0, "base_max": 1.0, "max_qscale_diff": t}
                         for lid, t in totals.items()} | {OUTPUT: {"cosine": 0.5}}  # fmt: skip
    models = {
        "compile": _fixed(dict.fromkeys(ids, 0.0), 0.0, substitutable=False),
        "board_sim": _fixed({k: t * 0.01 for k, t in totals.items()}, 1.0, substitutable=False),
    }
    return result, models


def test_sensitive_ops_from_total_errors_rank_where_the_error_enters(make_ctx):
    """compile -> board_sim, both programs: only total errors are known; relu's is all
    the conv's (5 steps, through conv2), the head's the conv's plus 1 of its own."""
    ids = ["conv", "relu", "head"]
    result, models = _total_errors_pair(ids, {"conv": 5.0, "relu": 5.0, "head": 6.0})
    layers = {
        "conv": Layer("conv", "conv", 0, ("input:x",)),
        "conv2": Layer("conv2", "conv", 1, ("conv",)),  # fused with relu: not captured
        "relu": Layer("relu", "relu", 2, ("conv2",)),
        "head": Layer("head", "linear", 3, ("relu",)),
    }
    dtypes = dict.fromkeys(ids, "int8")
    v = judge_pair(make_ctx(), models, result, _top1({}), np.arange(3), dtypes, layers)
    assert v.first_layer == "conv"
    assert [lid for lid, *_ in v.sensitive][:2] == ["conv", "head"]


def test_sensitive_ops_from_total_errors_rank_the_entry_above_what_amplifies_it(make_ctx):
    """The conv's 2 steps grow to 6 in conv2 (a fan-in sums them) and 7 in the head: conv2
    adds nothing, it only amplifies, yet it added the most steps to what it inherits."""
    ids = ["conv", "conv2", "head"]
    result, models = _total_errors_pair(ids, {"conv": 2.0, "conv2": 6.0, "head": 7.0})
    layers = {
        "conv": Layer("conv", "conv", 0, ("input:x",)),
        "conv2": Layer("conv2", "conv", 1, ("conv",)),
        "head": Layer("head", "linear", 2, ("conv2",)),
    }
    v = judge_pair(
        make_ctx(), models, result, _top1({}), np.arange(3), dict.fromkeys(ids, "int8"), layers
    )
    assert v.first_layer == "conv"
    assert [lid for lid, *_ in v.sensitive] == ["conv", "conv2", "head"]


def _noisy(values: dict[str, np.ndarray], noise: dict[str, np.ndarray]) -> StageModel:
    """A stage model whose layers are ``values`` plus ``noise`` (rows: samples), whatever
    it is fed."""

    def run(idx, replace):
        got = {k: v[idx] + noise[k][idx] if k in noise else v[idx] for k, v in values.items()}
        return got["head"], got

    return StageModel("x", run)


def _rounding(steps: float, worst: float) -> np.ndarray:
    """Rounding noise of +-half a step (``steps``), ``worst`` steps at one element of each
    sample (a weight-rounding outlier)."""
    noise = np.random.default_rng(7).uniform(-0.5, 0.5, size=(64, 32)) * steps
    noise[:, 5] = worst * steps
    return noise


def _result(base, ana, values, steps, totals, cosine=1.0) -> PairResult:
    result = PairResult(base, ana, layer_ids=list(values), steps=steps)
    result.aggregates = {lid: {"base_min": float(v.min()), "base_max": float(v.max()),
                               "max_qscale_diff": totals.get(lid, 0.0), "cosine": 1.0}
                         for lid, v in values.items()} | {OUTPUT: {"cosine": cosine}}  # fmt: skip
    return result


FLOAT = {
    lid: np.random.default_rng(i).normal(size=(64, 32)) for i, lid in enumerate(["conv", "head"])
}
STEPS = {"conv": 0.03, "head": 0.03}


def _top1(values: dict) -> Primary:
    """top-1 per stage as the primary metric, at the tiny spec's threshold."""
    return Primary("top1", values, 0.05)


FLOAT_PAIRS = [("prepare", "calibrate"), ("optimized", "calibrated")]  # QAT chain, PTQ chain


@pytest.mark.parametrize(("fp", "q"), FLOAT_PAIRS)
def test_the_float_pair_allows_the_noise_of_quantization(make_ctx, fp, q):
    """Every layer adds a few steps of its own (weights rounded): expected, not a
    divergence; nor is the output cosine, which sums every layer's noise."""
    calibrated = _noisy(FLOAT, {"conv": _rounding(0.03, 3), "head": _rounding(0.03, -2)})
    models = {fp: _noisy(FLOAT, {}), q: calibrated}
    result = _result(fp, q, FLOAT, STEPS, {"conv": 3, "head": 2}, cosine=0.99)
    v = judge_pair(make_ctx(), models, result, _top1({fp: 1.0, q: 1.0}), np.arange(3), {})
    assert v.reasons == [] and v.own.steps["conv"] > 2.5


@pytest.mark.parametrize(("fp", "q"), FLOAT_PAIRS)
def test_the_float_pair_diverges_on_a_top1_drop_or_a_clipping_layer(make_ctx, fp, q):
    clipped = dict(FLOAT, conv=np.clip(FLOAT["conv"], -0.2, 0.2))
    models = {fp: _noisy(FLOAT, {}), q: _noisy(clipped, {})}
    result = _result(fp, q, FLOAT, STEPS, {"conv": 60})
    v = judge_pair(make_ctx(), models, result, _top1({fp: 1.0, q: 0.75}), np.arange(3), {})
    assert v.reasons[0] == "top-1 drops 0.2500 (> 0.05)" and v.first_layer == "conv"
    assert "lose more than cosine" in v.reasons[1] and f"{q} stage/op problem at conv" in v.triage


def test_a_ptq_run_compares_its_float_model_and_judges_against_calibrated():
    """The PTQ chain starts at its float model (optimized): optimized -> calibrated is the
    quantization loss, and the later stages are also compared against calibrated."""
    chain = ["optimized", "calibrated", "ptq", "quantized"]
    assert chain_pairs(chain)[0] == ("optimized", "calibrated")
    assert _reference(chain) == 1 and chain[0] in ptq_analysis.CHAIN
    assert set(ptq_analysis.CHAIN) - {"board"} <= set(ptq_analysis.LOADERS)


def test_own_errors_are_judged_on_the_probe_samples_too(make_ctx):
    """A table 2 steps off on the probe samples (0-3) that are not among the bad cases."""
    shifted = {k: v.copy() for k, v in FLOAT.items()}
    shifted["conv"][:4] += 2 * STEPS["conv"]
    models = {"calibrate": _noisy(FLOAT, {}), "pre_export": _noisy(shifted, {})}
    result = _result("calibrate", "pre_export", FLOAT, STEPS, {"conv": 2})
    v = judge_pair(make_ctx(), models, result, _top1({}), np.arange(10, 20), {"conv": "int8"})
    assert v.first_layer == "conv" and "add more than 1 step" in v.reasons[0]
    assert v.samples == list(range(10, 20))  # the bad cases stay what they were


def test_own_errors_are_judged_on_probe_frames_when_no_tensors_are_kept(make_ctx):
    """``compare.probe_samples: 0`` keeps no full tensors; the table fault on the first
    frames (not among the bad cases) is still judged."""
    shifted = {k: v.copy() for k, v in FLOAT.items()}
    shifted["conv"][:4] += 2 * STEPS["conv"]
    models = {"calibrate": _noisy(FLOAT, {}), "pre_export": _noisy(shifted, {})}
    result = _result("calibrate", "pre_export", FLOAT, STEPS, {"conv": 2})
    ctx = make_ctx(compare={"probe_samples": 0})
    v = judge_pair(ctx, models, result, _top1({}), np.arange(10, 20), {"conv": "int8"})
    assert v.first_layer == "conv" and "add more than 1 step" in v.reasons[0]


def _camera(make_ctx):
    """The colour example's yuv444 variant: centred YUV training behind an nv12 camera."""
    data = tiny_spec_dict()["data"] | {"input_format": "yuv444", "mean": [128.0], "std": [128.0]}
    return make_ctx(data=data, stages={"board_sim": {"runtime_format": "nv12"}})


def _board(in_steps: float) -> tuple[dict, PairResult]:
    """compile fed featuremaps (a program: it takes a replaced input) and board_sim behind
    the camera, whose input is ``in_steps`` off; conv doubles its input, exactly."""
    x = np.random.default_rng(0).normal(size=(64, 32))

    def program(offset):
        def run(idx, replace):
            got = replace["input:x"] if replace else x[idx] + offset
            return 2 * got, {"input:x": got, "conv": 2 * got, "head": 2 * got}

        model = StageModel("x", run, substitutable=False)
        model.feedable = True  # a program fed featuremaps
        return model

    models = {"compile": program(0.0), "board_sim": program(in_steps * 0.01)}
    values = {"input:x": x, "conv": 2 * x, "head": 2 * x}
    steps = {"input:x": 0.01, "conv": 0.01, "head": 1e-5}
    totals = {"input:x": in_steps, "conv": 2 * in_steps, "head": 2e3 * in_steps}
    return models, _result("compile", "board_sim", values, steps, totals)


def test_a_clean_camera_run_is_judged_against_its_modelled_rounding(make_ctx):
    """A one-step input rounding of the camera path is no divergence, though it moves the
    int32 head by thousands of its steps."""
    models, result = _board(1.0)
    dtypes = {"input:x": "int8", "conv": "int8", "head": "int32"}
    v = judge_pair(_camera(make_ctx), models, result, _top1({}), np.arange(3), dtypes)
    assert v.reasons == [] and v.input_limit == 1.0 and max(v.own.steps.values()) == 0.0


def test_a_camera_preprocessing_mistake_diverges_at_the_input(make_ctx):
    models, result = _board(12.0)
    dtypes = {"input:x": "int8", "conv": "int8", "head": "int32"}
    v = judge_pair(_camera(make_ctx), models, result, _top1({}), np.arange(3), dtypes)
    assert v.reasons == ["camera input input:x off by 12 steps (> 1, the camera path's "
                         "modelled rounding)"]  # fmt: skip
    assert v.first_layer == "input:x" and "check the input data or preprocessing" in v.triage


def test_a_run_stopped_at_calibrate_has_quant_dtypes_in_its_vendor_files(store):
    """The vendor's own use: float vs the calibration model, before any convert; the
    integer layer table does not exist yet, calibrate's quantizers give the dtypes."""
    result = _run(store, stages={"stop_after": "calibrate"})
    debug = RunStore(store).open(result.run_id).path("debug")
    rows = csv.DictReader(io.StringIO((debug / "compare_per_layer_out.csv").read_text()))
    dtypes = {r["mod_name"]: r["quant_dtype"] for r in rows}
    assert dtypes["conv"] == "int8" and dtypes["relu"] == "int8", dtypes
