"""The per-pair layer comparison on a model with a layer that has no batch dimension."""

import threading
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from analysis.analyze import chain_pairs, comparable_stages
from analysis.compare import compare_batch, compare_stages
from analysis.layer_graph import load_layers
from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
from stages.context import RunContext
from stages.stage_models import StageModel, open_stage_model
from tests.conftest import tiny_chain_without_analysis, tiny_spec_dict


def test_a_reshaped_parameter_is_not_compared_per_sample(tmp_path):
    """ConvNeXt-style layer scale: its [1, C, 1, 1] tensor used to break the layer_stats
    columns ("expected length ... but got ..."); it is left out, the rest is compared."""
    data = {"dataset": "tests.models:layer_scale_data", "calibration_samples": 32,
            "evaluation_samples": 24, "batch_size": 16}  # fmt: skip
    spec = tiny_spec_dict(model={"factory": "tests.models:layer_scale"}, data=data)
    result = run_chain(parse_spec(spec, "t"), yaml.safe_dump(spec), tmp_path, use_prefect=False)
    run = RunStore(tmp_path).open(result.run_id)
    assert run.manifest().status == "complete"
    layers = {r["layer_id"] for r in read_run_table(run, "layer_stats")}
    assert "conv" in layers and "mul" in layers and "reshape" not in layers


CHAIN = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]
PAIRS = [*chain_pairs(CHAIN), *[("calibrate", s) for s in CHAIN[3:]]]
"""A QAT chain's pairs as analyze_models forms them: the reference (calibrate) against
each stage from export on."""


def _fake(nbytes_per_sample: int, live=None):
    """A stage model capturing ``nbytes_per_sample`` bytes per sample (output + layer
    ``a``); ``live`` counts its captures' layer tensors alive."""

    def run(idx, replace=None):
        k = len(idx)
        rng = np.random.default_rng(int(np.sum(idx)) + nbytes_per_sample)
        layer = rng.normal(size=(k, nbytes_per_sample // 4 - 2)).astype(np.float32)
        if live is not None:
            live.born(layer)
        return rng.normal(size=(k, 2)).astype(np.float32), {"a": layer}

    return StageModel("s", run)


class _Live:
    """The stage models' captures alive (not yet freed) and the most alive at once."""

    def __init__(self):
        self.alive, self.most, self.lock = 0, 0, threading.Lock()

    def born(self, tensor) -> None:
        with self.lock:
            self.alive += 1
            self.most = max(self.most, self.alive)
        weakref.finalize(tensor, self._freed)

    def _freed(self) -> None:
        with self.lock:
            self.alive -= 1


def _ctx(memory_mb: float, batch_size: int = 16):
    spec = SimpleNamespace(data=SimpleNamespace(batch_size=batch_size),
                           compare=SimpleNamespace(memory_mb=memory_mb))  # fmt: skip
    return SimpleNamespace(spec=spec)


@pytest.mark.parametrize(("memory_mb", "expected"), [(1024, 16), (3, 3), (1, 1)])
def test_the_comparison_batch_fits_the_memory_budget(memory_mb, expected):
    """Two models capturing 0.5 MB per sample each: 1 MB per sample for the pair."""
    models = {"a": _fake(2**19), "b": _fake(2**19)}
    assert compare_batch(_ctx(memory_mb), models, [("a", "b")]) == expected


@pytest.mark.parametrize(("memory_mb", "expected"), [(1024, 16), (6, 2), (5.9, 1), (3, 1)])
def test_the_budget_counts_the_captures_alive_at_once_not_every_model(memory_mb, expected):
    """Per sample, in quarters of a MB: prepare 8, calibrate 1, pre_export 2, export 3,
    convert 4, compile 5, board_sim 6 (29, 7.25 MB, in all). Alive at once while each
    runs: {prepare}, {prepare, calibrate}, {calibrate, pre_export}, {calibrate, pre_export,
    export}, {calibrate, export, convert}, {calibrate, convert, compile}, {calibrate,
    compile, board_sim}: at most 12 quarters, 3 MB a sample, so 6 MB takes 2 samples."""
    sizes = dict(zip(CHAIN, (8, 1, 2, 3, 4, 5, 6), strict=True))
    models = {s: _fake(q * 2**18) for s, q in sizes.items()}
    assert compare_batch(_ctx(memory_mb), models, PAIRS) == expected


def test_at_most_three_models_captures_are_alive_at_once(make_ctx):
    """The reference's, the previous stage's and the current one's, on every batch (the
    comparison used to hold all seven); every pair still compared on every sample."""
    live = _Live()
    models = {s: _fake(4096, live) for s in CHAIN}
    ctx = make_ctx(compare={"samples": 12, "memory_mb": 0.05})  # 4 samples a batch
    results = compare_stages(ctx, models, PAIRS, {}, {})
    assert live.most == 3 and live.alive == 0
    assert compare_batch(ctx, models, PAIRS) == 4
    assert list(results) == PAIRS
    assert all(len(r.per_sample("l1")) == 12 and r.layer_ids == ["a"] for r in results.values())


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    """The tiny model's whole chain (without its analysis): spec dict, run."""
    return tiny_chain_without_analysis(tmp_path_factory.mktemp("compare"))


def _parts(run) -> dict[str, bytes]:
    folder = run.path("tables/layer_stats")
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*.parquet")}


def test_streamed_pairs_write_what_each_pair_compared_alone_writes(chain_run):
    """Byte for byte, every part of every pair (2 batches of one sample, the stored
    outputs', the aggregates): streaming the models and dropping captures changes no row."""
    spec, run = chain_run
    spec = {**spec, "compare": {"samples": 2, "memory_mb": 0.001}}
    ctx = RunContext(spec=parse_spec(spec, "t"), run=run, code_version="")
    assert comparable_stages(ctx) == CHAIN
    models = {s: open_stage_model(ctx, s) for s in CHAIN}
    layers = load_layers(run, ("x",))
    compare_stages(ctx, models, PAIRS, layers, {})
    together = _parts(run)
    for pair in PAIRS:
        compare_stages(ctx, models, [pair], layers, {})
    assert len(together) == 4 * len(PAIRS) and _parts(run) == together


def test_a_smaller_comparison_batch_gives_the_same_aggregates(chain_run):
    """On the integer stages (whose values do not depend on the batch size): every
    aggregate but KL, whose histogram range is fixed on the first comparison batch, up to
    the order of the float64 running sums."""
    spec, run = chain_run
    spec = {**spec}
    got = {}
    for mb in (1024, 0.001):
        spec["compare"] = {**spec.get("compare", {}), "memory_mb": mb}
        ctx = RunContext(spec=parse_spec(spec, "t"), run=run, code_version="")
        chain = ["convert", "compile", "board_sim"]
        models = {s: open_stage_model(ctx, s) for s in chain}
        pairs = list(zip(chain, chain[1:], strict=False))
        got[mb] = compare_stages(ctx, models, pairs, load_layers(run, ("x",)), {})
        assert compare_batch(ctx, models, pairs) == (1 if mb < 1 else ctx.spec.data.batch_size)
    for pair, r in got[1024].items():
        small = got[0.001][pair].aggregates
        assert r.aggregates.keys() == small.keys() and len(r.aggregates) > 3
        for lid, values in r.aggregates.items():
            other = {k: v for k, v in small[lid].items() if k != "kl"}
            want = {k: pytest.approx(v, rel=1e-9, abs=1e-12, nan_ok=True)
                    for k, v in values.items() if k != "kl"}  # fmt: skip
            assert other == want, (pair, lid)


def test_the_output_only_runs_give_what_the_capturing_runs_give(chain_run):
    """StageModel.output (sensitivity's reverted runs: no layer kept or dequantized) equals
    run()'s output on every stage model, and with a layer replaced on the substitutable
    ones (the torch graphs, the ONNX graph's cut runner, the integer graph)."""
    spec, run = chain_run
    ctx = RunContext(spec=parse_spec(spec, "t"), run=run, code_version="")
    idx, changed = np.arange(3), []
    for stage in CHAIN:
        model = open_stage_model(ctx, stage)
        out, values = model.run(idx)
        np.testing.assert_array_equal(model.output(idx), out, err_msg=stage)
        if model.substitutable:
            lid = [k for k in values if not k.startswith("input:")][len(values) // 2]
            fed = {lid: np.asarray(values[lid]) * 0.5}
            want = model.run(idx, replace=fed)[0]
            np.testing.assert_array_equal(model.output(idx, replace=fed), want, err_msg=stage)
            assert model.outputs_only is not None, stage
            changed.append(not np.array_equal(want, out))
    assert len(changed) == 5 and all(changed)  # the replaced layer reached the output
