"""qparity verify: per-node cosine, output consistency and the vendor's three cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from analysis.verify import advice, consistency, cosine, verify
from analysis.verify_sides import side
from pipelines.flow import run_chain
from schemas.errors import SpecError
from schemas.spec import parse_spec
from tests.conftest import tiny_spec_dict


def test_cosine_and_consistency_follow_their_definitions():
    a, b = np.array([1.0, 2.0, 2.0]), np.array([1.0, 2.0, 2.5])
    assert math.isclose(cosine(a, b), 10.0 / (3.0 * math.sqrt(11.25)))
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0 and cosine(a, np.zeros(3)) == 0.0
    got = consistency(a, b, digits=1)
    assert got == {"Consistency": False, "Mismatched Elements": 1, "Max Abs Diff": 0.5,
                   "Max Rel Diff": 0.25}  # fmt: skip
    with pytest.raises(SpecError, match="shapes"):
        consistency(a, np.zeros(2), 5)


def test_the_three_cases():
    good = [{"OutputName": "o", "cosine": 1.0}]
    nodes = [{"TensorName": f"t{i}", "cosine": 1.0} for i in range(4)]
    assert advice(nodes, good).startswith("case 1")
    assert advice([{**n, "cosine": 0.1} for n in nodes], good).startswith("case 2")
    some = nodes[:2] + [{**n, "cosine": 0.5} for n in nodes[2:]]
    assert advice(some, good).startswith("case 3") and "t2" in advice(some, good)


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(
        faults=[{"kind": "bias_drop", "layer": "conv2"}], compare={"enabled": False}
    )
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    x = np.random.default_rng(0).uniform(-1, 1, (8, 1, 8, 8)).astype(np.float32)
    return root, result.run_id, x


def test_stages_of_a_run_name_the_faulty_layer(faulted):
    root, run_id, x = faulted
    got = verify(side(f"{run_id}:export", root), side(f"{run_id}:convert", root), x)
    first_bad = next(n["TensorName"] for n in got.nodes if n["cosine"] < 0.99)
    assert first_bad == "conv2" and got.advice.startswith("case 3")


def test_hbm_files_compare_outputs_only(faulted):
    root, run_id, x = faulted
    path = root / run_id / "artifacts/compile/model.hbm"
    got = verify(side(str(path), root), side(f"{run_id}:convert", root), x)
    assert got.nodes == [] and got.outputs[0]["Consistency"] is True


def test_an_unknown_reference_is_a_spec_error(faulted):
    root, _, _ = faulted
    with pytest.raises(SpecError, match="RUN_ID:stage"):
        side("nothing", root)
