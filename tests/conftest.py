"""Shared fixtures: tiny specs on the tiny models of tests/models.py, a temp run store."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker: -n 2 on 2 cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The simulator's kernels still run one OpenMP thread per core (simulator.runtime.
    # threads.kernel_count), so the two workers' teams share the cores: OpenMP threads
    # that wait asleep, not spinning, took 234-241 s of CPU for 4 heavy test files
    # against 260-275 s, and 125-130 s of wall time against 144-150 s.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch
import yaml

from schemas.spec import parse_spec
from schemas.store import RunStore
from stages.context import RunContext
from stages.registry import code_version

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

TINY = {
    "name": "tiny",
    "model": {"factory": "tests.models:tiny"},
    "data": {
        "dataset": "tests.models:data",
        "calibration_samples": 64,
        "evaluation_samples": 64,
        "batch_size": 32,
    },
    # 64 evaluation samples: top-1 moves in steps of 1/64, and the untrained tiny model's
    # near-tied logits flip a sample or two under quantization (float -> calibrate)
    "compare": {"thresholds": {"top1_drop": 0.05}},
}


def tiny_spec_dict(**sections) -> dict:
    """The tiny spec with sections replaced/added (e.g. quant={...})."""
    spec = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY.items()}
    spec.update(sections)
    return spec


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec dict as YAML and return its path."""

    def write(data: dict, name: str = "spec.yaml"):
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture
def make_ctx(tmp_path):
    """A RunContext in a fresh run of a temp store, for calling stage functions directly."""

    def make(**sections) -> RunContext:
        spec = parse_spec(tiny_spec_dict(**sections), "test spec")
        store = RunStore(tmp_path / "runs")
        run = store.create_run(spec.name, "", "0" * 64, code_version(), {}, {})
        return RunContext(spec=spec, run=run, code_version=code_version())

    return make


def cli_exit_code(monkeypatch, *args) -> int:
    """Run ``qparity ARGS`` in this process (the CLI's own ``main``); its exit code."""
    from qparity import cli

    monkeypatch.setattr(sys, "argv", ["qparity", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli.main()
        raise SystemExit(0)
    return e.value.code


def tiny_chain_without_analysis(root) -> tuple[dict, object]:
    """The tiny model's whole chain in store ``root``, analysis off: (spec dict, run)."""
    from pipelines.flow import run_chain

    spec = tiny_spec_dict(compare={"enabled": False})
    result = run_chain(parse_spec(spec, "t"), yaml.safe_dump(spec), root, use_prefect=False)
    return spec, RunStore(root).open(result.run_id)
