"""The per-pair layer comparison on a model with a layer that has no batch dimension."""

from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from analysis.compare import compare_batch, compare_stages
from analysis.layer_graph import load_layers
from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
from stages.context import RunContext
from stages.stage_models import StageModel, open_stage_model
from tests.conftest import tiny_spec_dict


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


def _fake(nbytes_per_sample: int):
    def run(idx, replace=None):
        k = len(idx)
        return np.zeros((k, 2), np.float32), {
            "a": np.zeros((k, nbytes_per_sample // 4), np.float32)
        }

    return StageModel("s", run)


@pytest.mark.parametrize(("memory_mb", "expected"), [(1024, 16), (3, 3), (1, 1)])
def test_the_comparison_batch_fits_the_memory_budget(memory_mb, expected):
    """Two models capturing 0.5 MB per sample each: 1 MB per sample for the pair."""
    spec = SimpleNamespace(data=SimpleNamespace(batch_size=16),
                           compare=SimpleNamespace(memory_mb=memory_mb))  # fmt: skip
    models = {"a": _fake(2**19 - 8), "b": _fake(2**19 - 8)}
    assert compare_batch(SimpleNamespace(spec=spec), models) == expected


def test_a_smaller_comparison_batch_gives_the_same_aggregates(tmp_path):
    """On the integer stages (whose values do not depend on the batch size): every
    aggregate but KL, whose histogram range is fixed on the first comparison batch, up to
    the order of the float64 running sums."""
    spec = tiny_spec_dict()
    result = run_chain(parse_spec(spec, "t"), yaml.safe_dump(spec), tmp_path, use_prefect=False)
    run = RunStore(tmp_path).open(result.run_id)
    got = {}
    for mb in (1024, 0.001):
        spec["compare"] = {**spec.get("compare", {}), "memory_mb": mb}
        ctx = RunContext(spec=parse_spec(spec, "t"), run=run, code_version="")
        chain = ["convert", "compile", "board_sim"]
        models = {s: open_stage_model(ctx, s) for s in chain}
        pairs = list(zip(chain, chain[1:], strict=False))
        got[mb] = compare_stages(ctx, models, pairs, load_layers(run, ("x",)), {})
        assert compare_batch(ctx, models) == (1 if mb < 1 else ctx.spec.data.batch_size)
    for pair, r in got[1024].items():
        small = got[0.001][pair].aggregates
        assert r.aggregates.keys() == small.keys() and len(r.aggregates) > 3
        for lid, values in r.aggregates.items():
            other = {k: v for k, v in small[lid].items() if k != "kl"}
            want = {k: pytest.approx(v, rel=1e-9, abs=1e-12, nan_ok=True)
                    for k, v in values.items() if k != "kl"}  # fmt: skip
            assert other == want, (pair, lid)
