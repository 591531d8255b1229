"""The run's thread count: one per core other processes leave free, set around the run only."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import SimulatorError
from simulator.program.isa import Op
from simulator.runtime import native, threads
from simulator.runtime.executor import KERNELS, Executor
from tests.simulator.runtime.test_executor import program


@pytest.mark.parametrize(("others", "allowed", "machine", "want"), [
    (0.0, 2, 2, 2), (0.2, 2, 2, 2), (0.3, 2, 2, 1), (1.0, 2, 2, 1), (2.0, 2, 2, 1),
    (1.0, 2, 4, 2),  # the busy cores are ones this process may not run on
    (2.5, 2, 4, 1), (0.0, 8, 8, 8), (3.1, 8, 8, 5),
])  # fmt: skip
def test_threads_for_counts_the_cores_left_free(others, allowed, machine, want):
    assert threads.threads_for(others, allowed, machine) == want


def test_free_cores_subtracts_this_process_and_waits_a_window():
    state = {"t": 0.0, "busy": 100.0, "own": 10.0}
    cores = threads.FreeCores(lambda: state["busy"], lambda: state["own"], lambda: state["t"])
    assert cores.others_busy() == 0.0  # no window yet
    state.update(t=0.1, busy=100.2, own=10.0)
    assert cores.others_busy() == 0.0  # shorter than WINDOW: the last answer
    state.update(t=1.0, busy=101.5, own=10.5)  # 1.5 core-s busy, 0.5 of them ours
    assert cores.others_busy() == pytest.approx(1.0)
    state.update(t=2.0, busy=101.6, own=10.6)  # all of it ours now
    assert cores.others_busy() == pytest.approx(0.0)


def test_free_cores_reads_proc_stat_once_a_window():
    state, reads = {"t": 0.0}, []
    cores = threads.FreeCores(lambda: reads.append(state["t"]) or 100.0, lambda: 0.0,
                              lambda: state["t"])  # fmt: skip
    for t in (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        state["t"] = t
        cores.others_busy()
    assert reads == [0.0, 0.3, 0.6]  # each a window after the last read


def test_qparity_threads_fixes_the_count(monkeypatch):
    busy = threads.FreeCores(lambda: 0.0)
    busy.others = 5.0
    monkeypatch.setattr(busy, "others_busy", lambda: 5.0)
    monkeypatch.setenv("QPARITY_THREADS", "3")
    assert threads.run_threads(busy) == 3
    monkeypatch.setenv("QPARITY_THREADS", "auto")
    assert threads.run_threads(busy) == 1
    for bad in ("two", "0", "-1"):
        monkeypatch.setenv("QPARITY_THREADS", bad)
        with pytest.raises(SimulatorError, match=f"QPARITY_THREADS='{bad}' is not a thread"):
            threads.run_threads(busy)


def test_the_kernels_keep_a_thread_per_core_under_load_and_torch_does_not(monkeypatch):
    """The kernels' pool never waits for a worker that has not claimed a chunk: a busy core
    still gets a thread (torch's barriers would wait for it), unless QPARITY_THREADS fixes
    the count."""
    monkeypatch.setattr(threads._CORES, "others_busy", lambda: 1.0)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads, "_MACHINE", 2)
    monkeypatch.setenv("QPARITY_THREADS", "auto")
    assert threads.run_threads() == 1 and threads.kernel_count() == 2
    monkeypatch.setenv("QPARITY_THREADS", "1")
    assert threads.kernel_count() == 1


@pytest.mark.skipif(native.library() is None, reason=f"compiled kernels {native.status()}")
@pytest.mark.parametrize("others", [1.0, 0.0])
def test_a_run_takes_every_core_and_gives_torch_its_count_back(monkeypatch, others):
    """Whether or not another process holds a core of two, the kernels run on two threads,
    and torch's thread count is what it was after the run."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(threads._CORES, "others_busy", lambda: others)
    lib, seen = native.untraced(), []
    clip = KERNELS[Op.CLIP]
    monkeypatch.setitem(KERNELS, Op.CLIP, lambda *a: seen.append(lib.qp_threads(0)) or clip(*a))
    before = lib.qp_threads(0)
    x = np.arange(-4, 4, dtype=np.int8).reshape(2, 4)
    ex = Executor(program(Op.CLIP, [x], [], {"lo": -2, "hi": 2}))
    (y,) = ex.run({"x0": x})[0].values()
    np.testing.assert_array_equal(y, np.clip(x, -2, 2))
    assert seen == [2] and lib.qp_threads(0) == before
