"""The per-pair layer comparison on a model with a layer that has no batch dimension."""

import yaml

from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
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
