"""The fault bench's own checks on tiny runs: calib_scale targets, the first_divergences check."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from bench.localization import localizer_first, output_quantized, sql_check, sql_first
from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from tests.conftest import tiny_spec_dict


def _run(root, **sections):
    data = tiny_spec_dict(**sections)
    return run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return RunStore(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def faulted(store):
    return _run(store.root, faults=[{"kind": "calib_scale", "layer": "conv", "amount": -8}])


def test_calib_scale_targets_are_the_layers_with_an_output_quantizer(store, faulted):
    layers = output_quantized(store.open(faulted.run_id))
    assert "conv" in layers and "reshape" not in layers
    assert not any(lid.startswith("input:") for lid in layers)


def test_the_view_names_what_the_localizer_named(store, faulted):
    assert sql_first(store.root, faulted.run_id) == ("prepare", "calibrate", "conv")
    assert localizer_first(faulted.analysis) == ("prepare", "calibrate", "conv")
    mismatches = []
    assert sql_check(store, faulted, mismatches) == "sql=ok" and mismatches == []


def test_a_clean_run_has_no_row_and_a_disagreement_is_reported_with_both_sides(store, faulted):
    clean = _run(store.root)
    assert sql_first(store.root, clean.run_id) is None
    assert sql_check(store, clean, []) == "sql=ok"
    first = dataclasses.replace(faulted.analysis.first, first_layer="relu")
    other = dataclasses.replace(clean, analysis=dataclasses.replace(clean.analysis, first=first))
    mismatches = []
    assert sql_check(store, other, mismatches) == "sql=MISMATCH"
    assert mismatches == [(clean.run_id, None, ("prepare", "calibrate", "relu"))]
