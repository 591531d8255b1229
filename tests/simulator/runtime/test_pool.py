"""simulator/csrc/qpool.c, the compiled kernels' thread pool, through a kernel: calls from
several threads at once, and a forked child, get whole and correct results. (Every kernel
on 1 and 3 threads: tests/simulator/kernels/conftest.py.)"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from simulator.kernels import exec_native_rows
from simulator.runtime import native, threads

pytestmark = pytest.mark.skipif(native.library() is None, reason=native.status())
SCALE = torch.tensor([0.05], dtype=torch.float64)


def _case(seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """A float input of 64 K values and its QUANTIZE by the formula (round half to even)."""
    x = torch.from_numpy(np.random.default_rng(seed).normal(0, 3, (4, 16384)))
    return x, np.clip(np.round(x.numpy() / 0.05), -128, 127).astype(np.int8)


def _quantize(x: torch.Tensor, n_threads: int) -> np.ndarray:
    with threads.kernel_threads(native.library(), n_threads):
        return exec_native_rows.quantize(x, SCALE, None, "int8", "half_even").numpy()


@pytest.fixture
def small_chunks():
    """Loops split into chunks of about 64 values, so every call uses the pool."""
    native.library().qp_pool_sizes(1, 64)
    yield
    native.library().qp_pool_sizes(0, 0)


def test_calls_from_several_threads_at_once_are_each_whole(small_chunks):
    """One call holds the pool, the others run alone meanwhile: each gets its own result."""
    cases = [_case(s) for s in range(4)]
    bad = []

    def work(i: int) -> None:
        for _ in range(30):
            x, want = cases[i]
            if not np.array_equal(_quantize(x, 3), want):
                bad.append(i)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad


def _child(out) -> None:
    x, want = _case(1)
    got = _quantize(x, 2)
    names = [Path(f"/proc/self/task/{t}/comm").read_text().strip()
             for t in os.listdir("/proc/self/task")]  # fmt: skip
    out.put((bool(np.array_equal(got, want)), names.count("qparity-pool")))


def test_a_forked_child_starts_its_own_workers(small_chunks):
    """fork copies the calling thread only: the child must not count on the parent's
    workers (it would run every chunk alone) but start its own."""
    x, want = _case(0)
    assert np.array_equal(_quantize(x, 2), want)  # the parent's worker is started
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(out,))
    p.start()
    equal, workers = out.get(timeout=60)
    p.join(timeout=60)
    assert equal and workers == 1


def _workers() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")
            if Path(f"/proc/self/task/{t}/comm").read_text().strip() == "qparity-pool"]  # fmt: skip


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="steering needs 2 cores")
def test_a_woken_worker_stays_off_the_callers_core(small_chunks):
    """A job that wakes a sleeping worker first narrows its cores to the caller's others
    (qpool.c, steer_workers), and the worker keeps that set after it woke and ran: the next
    wake-up from the same core sets nothing. A few tries: the caller may move between
    cores in a job."""
    x, want = _case(2)
    allowed, sched_getcpu = os.sched_getaffinity(0), ctypes.CDLL(None).sched_getcpu
    kept = []
    for _ in range(20):
        assert np.array_equal(_quantize(x, 2), want)  # the worker exists
        time.sleep(0.02)  # past its 5 ms spin: it sleeps, so the next job steers it
        cpu = sched_getcpu()
        assert np.array_equal(_quantize(x, 2), want)
        if sched_getcpu() != cpu:
            continue
        time.sleep(0.001)  # the worker runs on after the job
        kept.append(os.sched_getaffinity(min(_workers())) == allowed - {cpu})
        if kept[-1]:
            break
    assert any(kept), f"worker 0 did not keep the caller's other cores in {len(kept)} tries"


def _owners(n: int, runs: bool = False):
    """Which thread ran each of n items, one chunk each (small_chunks), busy for 50 us
    (0: the caller); with ``runs``, also where each claimed run of items began."""
    out = np.full(2 * n, -1, dtype=np.int64)
    with threads.kernel_threads(native.library(), 2):
        native.library().qp_pool_owners(n, 64, 50_000, native.ptr(torch.from_numpy(out)))
    return (out[:n], out[n:]) if runs else out[:n]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a worker needs a second core")
def test_the_caller_takes_the_first_items_and_the_worker_the_last(small_chunks):
    """The caller claims chunks from the front and the worker from the back (qpool.c), so
    each runs one run of neighbouring items: the rows a kernel writes on a core are the
    rows the next kernel reads there. Taken in turn from the front, they interleave."""
    shared = 0
    for _ in range(50):
        owners = _owners(64)
        assert set(owners) <= {0, 1}, "every item ran once, by the caller or its worker"
        k = int(np.argmax(owners != 0)) if (owners != 0).any() else len(owners)
        assert (owners[:k] == 0).all() and (owners[k:] == 1).all(), owners
        shared += 0 < k < len(owners)
        if shared >= 3:
            break
    assert shared >= 3, "the worker never took part"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a worker needs a second core")
def test_threads_claim_runs_of_chunks_that_shrink_as_the_job_ends(small_chunks):
    """A claim takes a 2 * team-th of the chunks left (at least one), so 64 chunks go in
    15 to 20 claims, not 64 (each claim moves the ticket's cache line between the cores),
    nor in two halves (a thread held up on a busy core would hold its half)."""
    for _ in range(20):
        owners, starts = _owners(64, runs=True)
        assert set(owners) <= {0, 1} and set(starts) <= {0, 1}
        assert 8 <= starts.sum() <= 24, starts
        assert starts[0] == 1
        if 0 < (owners == 1).sum() < 64:
            return
    pytest.fail("the worker never took part")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a worker needs a second core")
def test_a_wake_keeps_sleeping_workers_spinning_for_the_next_job():
    """qp_pool_wake (the frozen plan's run calls it as it begins) wakes the workers that
    sleep, and a woken worker spins for the next job (its 5 ms again) instead of going back
    to sleep at once. The pool reports how long a woken worker stayed awake (measured by the
    worker, so a loaded host that runs this thread late does not change it). A try in which
    no woken worker goes back to sleep within a second (a job of another thread woke it
    first: its spin then ends in that job) is made again."""
    lib, (x, want) = native.library(), _case(5)
    for _ in range(3):  # a try another thread's job cuts short records nothing: again
        assert np.array_equal(_quantize(x, 2), want)  # the worker exists
        asleep = len(_workers())  # every worker, past its 5 ms spin
        _wait_for(lambda: lib.qp_pool_sleepers() == asleep, "slept")  # noqa: B023
        lib.qp_pool_woken_spin()  # forgets any wake before this one
        with threads.kernel_threads(lib, 2):
            woke = lib.qp_pool_wake()
        assert woke == 1, f"qp_pool_wake returned {woke} with {asleep} asleep"
        deadline, spun = time.monotonic() + 1.0, 0
        while not spun and time.monotonic() < deadline:
            time.sleep(0.0005)
            spun = lib.qp_pool_woken_spin()
        if spun:
            break
    assert spun, "no woken worker slept again within a second, three times"
    assert spun >= 5_000_000, f"a woken worker slept again after {spun} ns"


def _wait_for(ready, state: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        sleepers = native.library().qp_pool_sleepers()
        assert time.monotonic() < deadline, f"the pool's workers never {state} ({sleepers} asleep)"
        time.sleep(0.0005)
