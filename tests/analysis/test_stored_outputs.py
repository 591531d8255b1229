"""Outputs compared on every sample from the stages' stored outputs; layers on
``compare.samples`` only; the old path when a stage stored none."""

import numpy as np
import pytest

from analysis.compare import OUTPUT, compare_stages
from analysis.layer_graph import load_layers
from analysis.stored_outputs import stored_outputs
from schemas.spec import parse_spec
from schemas.table_digests import remove_parts
from schemas.tables import read_run_table
from stages.context import RunContext
from stages.stage_models import open_stage_model
from tests.conftest import tiny_chain_without_analysis

CHAIN = ["calibrate", "convert", "compile", "board_sim"]


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    return tiny_chain_without_analysis(tmp_path_factory.mktemp("stored"))


def _compare(spec: dict, run, samples: int | None):
    spec = {**spec, "compare": {"samples": samples}}
    ctx = RunContext(spec=parse_spec(spec, "t"), run=run, code_version="")
    models = {s: open_stage_model(ctx, s) for s in CHAIN}
    pairs = list(zip(CHAIN, CHAIN[1:], strict=False))
    results = compare_stages(ctx, models, pairs, load_layers(run, ("x",)), {})
    return ctx, models, results


def test_every_stage_stored_its_outputs_as_its_model_computes_them(chain_run):
    spec, run = chain_run
    ctx = RunContext(spec=parse_spec(spec, "t"), run=run, code_version="")
    stored = stored_outputs(ctx, CHAIN)
    assert {s: v.shape for s, v in stored.items()} == dict.fromkeys(CHAIN, (64, 10))
    for stage in ("convert", "compile", "board_sim"):  # integers: exactly
        out, _ = open_stage_model(ctx, stage).run(np.arange(8))
        np.testing.assert_array_equal(stored[stage][:8], out, err_msg=stage)


def test_outputs_are_compared_on_every_sample_and_layers_on_the_first_few(chain_run):
    spec, run = chain_run
    _, _, results = _compare(spec, run, 8)
    rows = [r for r in read_run_table(run, "layer_stats") if r["sample_id"] is not None]
    for (base, ana), r in results.items():
        mine = [x for x in rows if (x["base_stage"], x["analysis_stage"]) == (base, ana)]
        assert sorted(x["sample_id"] for x in mine if x["layer_id"] == OUTPUT) == list(range(64))
        first = r.layer_ids[0]
        assert sorted(x["sample_id"] for x in mine if x["layer_id"] == first) == list(range(8))
        assert len(r.per_sample("l1")) == 64  # bad cases are picked among all of them
        assert r.aggregates[OUTPUT]["l1"] >= 0


def _batchless(metric: str) -> bool:
    return metric != "kl" and "qscale" not in metric


def test_without_stored_outputs_the_models_give_them_on_the_compared_samples(chain_run):
    spec, run = chain_run
    _, _, stored = _compare(spec, run, None)
    remove_parts(run, "tables/stage_outputs/compile")
    _, _, ran = _compare(spec, run, None)
    for pair, r in ran.items():
        assert len(r.per_sample("l1")) == 64
        # (the step of the output and KL's histogram range come from the first batch)
        want = {k: pytest.approx(v, rel=1e-6, abs=1e-9, nan_ok=True)
                for k, v in stored[pair].aggregates[OUTPUT].items() if _batchless(k)}  # fmt: skip
        got = {k: v for k, v in r.aggregates[OUTPUT].items() if _batchless(k)}
        assert got == want, pair
    _, _, few = _compare(spec, run, 8)
    assert all(len(r.per_sample("l1")) == 8 for r in few.values())


def test_a_tampered_stored_output_is_named_never_compared(chain_run):
    """A part changed after the stage wrote it fails its manifest digest: ArtifactError
    naming the file (the run's own copy is restored afterwards for the other tests)."""
    from schemas.errors import ArtifactError

    spec, run = chain_run
    part = run.path("tables/stage_outputs/convert/all.parquet")
    saved = part.read_bytes()
    try:
        part.write_bytes(saved[:-8] + b"tampered")
        ctx = RunContext(spec=parse_spec(spec, "t"), run=run, code_version="")
        with pytest.raises(ArtifactError, match="stage_outputs"):
            stored_outputs(ctx, CHAIN)
    finally:
        part.write_bytes(saved)
