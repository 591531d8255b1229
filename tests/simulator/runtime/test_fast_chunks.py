"""simulator/runtime/fast_chunks.py: a batch split's chunks in one call of qp_run_chunks give
the batch's outputs, in order, and step aside where the Python path must run."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.runtime import native, split
from simulator.runtime.executor import Executor
from simulator.runtime.fast import FastRun
from simulator.runtime.fast_chunks import FastBatch, FastChunks
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


def _served(ex: Executor, x: np.ndarray, monkeypatch, by=(FastChunks, FastBatch)):
    """The run's output, and whether qp_run_chunks gave it (called by a class of ``by``)."""
    got, reals = [], [cls.run for cls in by]
    for cls, real in zip(by, reals, strict=True):
        monkeypatch.setattr(cls, "run", lambda self, *a, real=real: got.append(real(self, *a))
                            or got[-1])  # fmt: skip
    y = ex.run({"x": x})[0]["y"]
    for cls, real in zip(by, reals, strict=True):
        monkeypatch.setattr(cls, "run", real)
    return y, any(g is not None for g in got)


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


def test_a_batch_once_split_takes_one_call_from_numpy(chunked, monkeypatch):
    """After the chunks went through qp_run_chunks once, the owner's runs of that batch's
    geometry are one qp_run_batch_np call (no split Python), with the whole batch's
    outputs."""
    prog, ex = _program(), _warm()
    _served(ex, _batch(8, 30), monkeypatch)
    assert isinstance(ex._batch, FastBatch)
    for seed in range(31, 36):
        x = _batch(8, seed)
        y, served = _served(ex, x, monkeypatch, by=(FastBatch,))
        assert served
        np.testing.assert_array_equal(y, _whole(prog, x))
        assert ex.last_path == "frozen plan, batch split: 4 chunks of 2 on 2 threads"


@pytest.mark.parametrize("case", ["another batch", "read-only", "one thread", "inf", "list"])
def test_the_batch_call_steps_aside_where_the_split_decides_otherwise(case, chunked,
                                                                       monkeypatch):  # fmt: skip
    """Another geometry, a read-only batch, QPARITY_THREADS=1 (the split runs its chunks in
    turn), a value the plan refuses, a list: not served by the call, the whole batch's
    outputs all the same; the next batch of its geometry is served again."""
    prog, ex = _program(), _warm()
    _served(ex, _batch(8, 40), monkeypatch)
    x = _batch(6 if case == "another batch" else 8, 41)
    if case == "read-only":
        x.flags.writeable = False
    if case == "inf":
        x[5, 1] = np.inf
    if case == "one thread":
        monkeypatch.setenv("QPARITY_THREADS", "1")
    feed = x.tolist() if case == "list" else x
    got, served = [], FastBatch.run
    monkeypatch.setattr(FastBatch, "run", lambda self, *a: got.append(served(self, *a)) or got[-1])
    y = ex.run({"x": feed})[0]["y"]
    assert got and all(g is None for g in got)
    np.testing.assert_array_equal(y, _whole(prog, np.asarray(x)))
    monkeypatch.setenv("QPARITY_THREADS", "2")
    again = _batch(8, 42)
    np.testing.assert_array_equal(ex.run({"x": again})[0]["y"], _whole(prog, again))
    assert got[-1] is not None


def test_the_batch_calls_seconds_are_its_last_runs(chunked):
    """qp_run_batch_np zeroes the owner's seconds before it sums them over its chunks."""
    ex = _warm(timings=True)
    for seed in range(50, 53):
        ex.run({"x": _batch(8, seed)})
    batch = ex._batch
    assert isinstance(batch, FastBatch)
    batch.seconds[:] = 1e9  # what a run that did not zero them would add to
    ex.run({"x": _batch(8, 54)})
    assert ex.last_path.startswith("frozen plan, batch split")
    assert all(0 <= s < 1 for _, _, s in ex.timings)
    assert {i for i, _, _ in ex.timings} == {0, 1, 2}
