"""simulator/runtime/fast_chunks.py: a batch split's chunks in one call of qp_run_chunks give
the batch's outputs, in order, and step aside where the Python path must run."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.runtime import native, split
from simulator.runtime.executor import Executor
from simulator.runtime.fast import FastRun
from simulator.runtime.fast_chunks import FastChunks
from tests.simulator.runtime.test_split import _batch, _program, _whole

pytestmark = pytest.mark.skipif(native.library() is None, reason="no compiled kernels here")


@pytest.fixture
def chunked(monkeypatch):
    """Batches of 8 as 4 chunks of 2 samples on 2 threads."""
    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 64)  # 2 samples of 32 bytes a chunk
    monkeypatch.setenv("QPARITY_THREADS", "2")


def _warm(**kw) -> Executor:
    """A split executor whose owner and twin both have their fast run. Each twin also runs
    a chunk directly: on a program this small the owner, once it has its fast run, can take
    every chunk of a batch before the pool thread gets the GIL, and the twin then stayed
    without one through all 60 batches in about one run of three."""
    ex = Executor(_program(), **kw)
    for seed in range(60):
        x = _batch(8, seed)
        ex.run({"x": x})
        for twin in ex.split.twins:
            twin.run_batch({"x": x[:2]}, 1)
        if all(isinstance(e._fast, FastRun) for e in (ex, *ex.split.twins)) and ex.split.twins:
            return ex
    pytest.fail("the twin never got its fast run")


def _served(ex: Executor, x: np.ndarray, monkeypatch) -> tuple[np.ndarray, bool]:
    """The run's output, and whether qp_run_chunks gave it."""
    got, real = [], FastChunks.run
    monkeypatch.setattr(FastChunks, "run", lambda self, *a: got.append(real(self, *a)) or got[-1])
    y = ex.run({"x": x})[0]["y"]
    monkeypatch.setattr(FastChunks, "run", real)
    return y, bool(got) and got[-1] is not None


def test_the_chunks_in_one_call_give_the_whole_batchs_outputs(chunked, monkeypatch):
    prog, ex = _program(), _warm()
    for seed in range(100, 106):
        x = _batch(8, seed)
        y, served = _served(ex, x, monkeypatch)
        assert served
        np.testing.assert_array_equal(y, _whole(prog, x))
        assert ex.last_path == "frozen plan, batch split: 4 chunks of 2 on 2 threads"


def test_a_chunk_the_plan_refuses_sends_the_batch_the_python_way(chunked, monkeypatch):
    """An inf in the last chunk: its QUANTIZE reports it, qp_run_chunks stops, and the batch
    runs chunk by chunk through the executors' own paths, with the whole batch's outputs."""
    prog, ex = _program(), _warm()
    bad = _batch(8, 7)
    bad[7, 3] = np.inf
    y, served = _served(ex, bad, monkeypatch)
    assert not served
    np.testing.assert_array_equal(y, _whole(prog, bad))
    x = _batch(8, 8)
    y, served = _served(ex, x, monkeypatch)  # and the next batch is served again
    assert served
    np.testing.assert_array_equal(y, _whole(prog, x))


def test_inputs_that_are_not_slices_of_one_batch_are_refused(chunked):
    ex = _warm()
    runs = [ex._fast, *(t._fast for t in ex.split.twins)]
    x = _batch(8, 9)
    parts = [{"x": x[i : i + 2]} for i in range(0, 8, 2)]
    chunks = FastChunks.build(runs, parts[0])
    assert chunks is not None and chunks.run(parts, 2, False) is not None
    shuffled = [parts[0], parts[2], parts[1], parts[3]]
    assert chunks.run(shuffled, 2, False) is None
    copies = [{"x": p["x"].copy()} for p in parts]
    assert chunks.run(copies, 2, False) is None


def test_the_owners_timings_come_from_the_chunks_it_ran(chunked, monkeypatch):
    """The calling thread's task adds its plan's seconds per instruction over its chunks
    (a try in which the worker took every chunk has none: another is made)."""
    ex = _warm(timings=True)
    for seed in range(10, 20):
        _, served = _served(ex, _batch(8, seed), monkeypatch)
        assert served
        timed = ex.timings
        assert {i for i, _, _ in timed} == {0, 1, 2}
        assert all(s >= 0 for _, _, s in timed)
        if sum(s for _, _, s in timed) > 0:
            return
    pytest.fail("the caller's task never ran a chunk")
