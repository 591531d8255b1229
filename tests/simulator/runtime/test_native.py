"""What the compiled kernels tell a test run about this machine: a kernel path the CPU
cannot run (the AMX-INT8 kernels on a CPU without AMX) is reported skipped, with the
reason, in the suite's own output (the README's ``pytest -q``), not only under ``-rs``."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.runtime import native

REPO = Path(__file__).resolve().parents[3]
AMX_TEST = "tests/simulator/kernels/test_exec_native.py::test_native_linear_on_amx_equals_qlinear"


def test_a_run_without_amx_says_the_amx_kernel_was_not_tested(capsys):
    """The suite's configuration (pyproject's addopts), in process. The kernels' conftest
    stays: on an AMX host the test runs, and needs its ``pool_threads`` fixture."""
    rc = pytest.main(["-q", "--rootdir", str(REPO), str(REPO / AMX_TEST)])
    run = capsys.readouterr()
    assert rc == 0, run.out[-2000:] + run.err[-2000:]
    out = " ".join(run.out.split())
    if native.library() is None:  # the whole module skips, saying why the kernels do not run
        assert "SKIPPED" in out and " ".join(native.status().split()) in out
    elif native.amx_supported():  # once per thread count of the kernels' conftest
        assert "2 passed" in out and "SKIPPED" not in out
    else:
        assert "SKIPPED" in out
        assert "AMX-INT8 kernels (qamx.c, qamxconv.c) not tested here" in out
        assert " ".join(native.linear_kernel().split()) in out
