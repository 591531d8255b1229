"""Short fuzzing runs (bench/fuzz.py runs the same targets longer): our errors or success,
never another exception."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.flow import run_chain
from schemas.spec import parse_spec
from tests.conftest import tiny_spec_dict
from tests.fuzz import targets
from tests.simulator.program.test_hbm import small_program


@settings(max_examples=300, deadline=None)
@given(targets.spec_data())
def test_spec_loader(data):
    assert not targets.outcome(targets.spec_target, data).startswith("CRASH")


PROGRAM = small_program()
LEAVES = targets._replace_nth(
    __import__("simulator.program.hbm", fromlist=["_header"])._header(PROGRAM)[0], -1, None
)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, LEAVES - 1), targets.leaves)
def test_hbm_loader_with_valid_checksums(n, value):
    got = targets.outcome(targets.hbm_target, (n, value), PROGRAM)
    assert not got.startswith("CRASH"), got


@pytest.fixture(scope="module")
def qat_onnx(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(stages={"stop_after": "export"}, compare={"enabled": False})
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return onnx.load(str(root / result.run_id / "artifacts/export/qat.onnx"))


@pytest.mark.parametrize("seed", range(40))
def test_onnx_importers(qat_onnx, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, (2, 1, 8, 8)).astype(np.float32)
    got = targets.outcome(targets.onnx_target, targets.mutate_onnx(qat_onnx, seed), x)
    assert not got.startswith("CRASH"), got
