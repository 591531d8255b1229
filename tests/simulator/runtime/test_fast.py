"""simulator.runtime.fast: the frozen plan run straight from numpy gives exactly what the
kernels give, and every input it does not cover goes the executor's own way."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from simulator.runtime import native
from simulator.runtime.executor import Executor
from simulator.runtime.fast import FastRun, geometry, pointers, raw_view, readable, spec
from simulator.runtime.fast_chunks import FastChunks
from tests.simulator.runtime.test_frozen import _assert_same, _batches, _fresh, _program

pytestmark = pytest.mark.skipif(native.library() is None, reason="no compiled kernels here")


def _warm(prog, runs: int = 5, **kw) -> Executor:
    ex = Executor(prog, **kw)
    for x in _batches(runs):
        ex.run({"x": x})
    return ex


def _served(ex: Executor, x, monkeypatch) -> bool:
    """Whether the fast run served ``x`` (FastRun.run returned outputs)."""
    got = []
    real = FastRun.run
    monkeypatch.setattr(FastRun, "run", lambda self, *a: got.append(real(self, *a)) or got[-1])
    ex.run({"x": x})
    monkeypatch.setattr(FastRun, "run", real)
    return bool(got) and got[-1] is not None


@pytest.mark.parametrize("dequantize", [True, False], ids=["float-output", "int8-output"])
def test_the_fast_run_equals_the_kernels_and_serves_repeated_runs(dequantize, monkeypatch):
    prog = _program(dequantize)
    ex = _warm(prog)
    assert isinstance(ex._fast, FastRun)
    for x in _batches(4, seed=7):
        assert _served(ex, x, monkeypatch)
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
        assert ex.last_path == "frozen plan"


def test_outputs_are_the_callers_own_copies():
    prog = _program()
    ex = _warm(prog)
    a, b = _batches(2, seed=8)
    first = ex.run({"x": a})[0]
    kept = {k: v.copy() for k, v in first.items()}
    ex.run({"x": b})
    _assert_same(first, kept)


def test_inputs_it_does_not_cover_go_the_executors_way(monkeypatch):
    """Another geometry, another dtype (the executor converts it), a read-only array, a
    list: the executor's own path, with the same outputs as a fresh executor's."""
    prog = _program()
    ex = _warm(prog)
    x = _batches(1, seed=9)[0]
    readonly = x.copy()
    readonly.flags.writeable = False
    for other in (_batches(1, rows=6)[0], x.astype(np.float64), readonly, x.tolist()):
        assert not _served(ex, other, monkeypatch)
        _assert_same(ex.run({"x": other})[0], _fresh(prog, np.asarray(other, np.float32))[0])
    assert _served(ex, x, monkeypatch)


def test_a_plan_built_on_converted_inputs_has_no_fast_run():
    """float64 inputs reach the plan as float32 copies: their pointers must not."""
    prog = _program()
    ex = Executor(prog)
    for x in _batches(5):
        ex.run({"x": x.astype(np.float64)})
    assert ex._fast is False
    x = _batches(1, seed=10)[0].astype(np.float64)
    _assert_same(ex.run({"x": x})[0], _fresh(prog, x.astype(np.float32))[0])


def test_a_changed_return_value_and_a_held_capture_step_aside(monkeypatch):
    prog = _program(dequantize=False)
    ex = _warm(prog)
    bad = _batches(1, seed=4)[0]
    bad[2, 3] = np.inf  # QUANTIZE reports it: the plan stops, the kernels run
    assert not _served(ex, bad, monkeypatch)
    _assert_same(ex.run({"x": bad})[0], _fresh(prog, bad)[0])
    x, y = _batches(2, seed=11)
    outs, caps = ex.run({"x": x}, capture=True)  # the capture views a watched buffer
    assert not _served(ex, y, monkeypatch)
    _assert_same(ex.run({"x": y})[0], _fresh(prog, y)[0])
    _assert_same(caps, _fresh(prog, x, capture=True)[1])


def test_timings_come_per_instruction_from_the_fast_run(monkeypatch):
    prog = _program()
    ex = _warm(prog, timings=True)
    x = _batches(1, seed=12)[0]
    assert _served(ex, x, monkeypatch)
    ex.run({"x": x})
    assert [i for i, _, _ in ex.timings] == sorted({i for i, _, _ in ex.timings})
    assert ex.timings and all(s >= 0 for *_, s in ex.timings)


def test_timings_are_the_last_runs_whichever_path_ran(monkeypatch):
    """The plan's timings are built when read, after the run: a run through the plan, then a
    capture (instruction by instruction: every instruction timed, views too), then the plan
    again: each read gives the run just before it, and a list read earlier stays as read."""
    prog = _program()
    ex = _warm(prog, timings=True)
    x = _batches(1, seed=13)[0]
    assert _served(ex, x, monkeypatch)
    planned = [i for i, _, _ in ex.timings]
    ex.run({"x": x}, capture=True)
    stepped = ex.timings
    assert [i for i, _, _ in stepped] == list(range(len(prog.instructions)))
    assert len(planned) < len(stepped)  # the plan times instructions with calls only
    ex.run({"x": x})
    assert [i for i, _, _ in ex.timings] == planned
    assert [i for i, _, _ in stepped] == list(range(len(prog.instructions)))
    assert Executor(prog).timings is None


def test_geometry_names_what_the_plan_needs():
    x = np.zeros((4, 8), np.float32)
    assert geometry([x, x])[-1] == (0, 0)  # both inputs share one pointer
    assert geometry([x, x.copy()])[-1] == (0, 1)
    assert geometry([x[:, ::-1]]) is None
    assert geometry([x.tolist()]) is None


def _geometry_cases() -> list[list]:
    """Inputs that differ from each other in each part of the geometry."""
    x = np.zeros((4, 8), np.float32)
    readonly = x.copy()
    readonly.flags.writeable = False
    arrays = [x, x.copy(), x[:, :4], x.T, x.astype(np.float64), x.reshape(8, 4), readonly,
              np.zeros((4, 8), np.int32), x.tolist(), None]  # fmt: skip
    return [[a] for a in arrays] + [[x, x], [x, x.copy()], [x.copy(), x]]


def test_pointers_pass_exactly_the_inputs_of_the_geometry():
    """pointers(xs, key) gives the data pointers where geometry(xs) == key, else None."""
    cases = _geometry_cases()
    for xs in cases:
        for ys in cases:
            key = geometry(ys)
            if key is None or len(xs) != len(ys):
                continue
            got = pointers(xs, key)
            assert (got is not None) == (geometry(xs) == key), (xs, ys)
            if got is not None:
                assert got == [a.__array_interface__["data"][0] for a in xs]


def _np_plan(threads: int | None = None):
    """A plan array for qp_run_np: no call, or one call of qp_threads(0) recorded as
    returning ``threads`` (so the run stops, 0, when the calls ran on another count)."""
    from simulator.program.isa import Op
    from simulator.runtime.frozen import Slots

    lib = native.library()
    calls = [] if threads is None else [(0, Op.CLIP, lib.qp_threads, [0], (), threads)]
    slots = Slots.of(calls)
    return slots, (ctypes.c_int64 * 9)(*slots.pointers())


def _run_np(plan, xs, key, n: int = 1) -> int:
    """qp_run_np of ``plan`` on inputs ``xs`` against geometry ``key`` on ``n`` threads."""
    where, at = spec(key)
    for a, x in zip(at, xs, strict=True):
        where[a] = id(x)
    return native.library().qp_run_np(plan, where, n, 0)


def test_the_c_side_passes_exactly_the_inputs_of_the_geometry():
    """qp_run_np runs the plan (1) where geometry(xs) == key and refuses the inputs (-1)
    everywhere else, reading numpy's array struct: the same cases as pointers()."""
    keep, plan = _np_plan()
    cases = _geometry_cases()
    for ys in cases:
        key = geometry(ys)
        for xs in cases:
            if key is not None and len(xs) == len(ys):
                want = 1 if geometry(xs) == key else -1
                assert _run_np(plan, xs, key) == want, (xs, ys)


def test_the_c_side_reads_arrays_as_python_does():
    """readable(): the type, dtype, data pointer, flags, shape and strides qp_np_view reads
    are Python's, for arrays of every kind the executor meets; ranks above 8 are not."""
    import torch

    lib = native.library()
    x = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)
    readonly = x.copy()
    readonly.flags.writeable = False
    for a in (x, x[:, 1:, ::2], x.transpose(0, 2, 3, 1), x.astype(np.float64), readonly,
              np.ones((), np.float32), x.reshape(-1), torch.zeros(2, 3).numpy(),
              np.zeros((1,) * 8, np.int8)):  # fmt: skip
        assert readable(a, lib), a.shape
    assert not readable(np.zeros((1,) * 9, np.int8), lib)


@pytest.mark.parametrize("value, want", [("3", 3), ("1", 1), ("07", 7), ("auto", None),
                                         (None, None)])  # fmt: skip
def test_the_c_side_reads_the_thread_count_as_kernel_count_does(value, want, monkeypatch):
    """qp_run_np with n = 0 runs the calls on $QPARITY_THREADS or the process's cores, the
    count threads.kernel_count() gives; n > 0 is taken as it is."""
    from simulator.runtime import threads

    if value is None:
        monkeypatch.delenv("QPARITY_THREADS", raising=False)
    else:
        monkeypatch.setenv("QPARITY_THREADS", value)
    count = want or len(os.sched_getaffinity(0))
    assert threads.kernel_count() == count
    x = np.zeros((2, 2), np.float32)
    keep, plan = _np_plan(count)
    assert _run_np(plan, [x], geometry([x]), 0) == 1
    keep, other = _np_plan(count + 1)
    assert _run_np(other, [x], geometry([x]), 0) == 0
    assert _run_np(other, [x], geometry([x]), count + 1) == 1


@pytest.mark.parametrize("value", ["two", "0", "", "-1", "1.5"])
def test_a_thread_count_the_c_side_does_not_read_goes_to_python(value, monkeypatch):
    """-2 from qp_run_np, and Executor.run names the variable (the fast run steps aside)."""
    from schemas.errors import SimulatorError

    ex = _warm(_program())
    monkeypatch.setenv("QPARITY_THREADS", value)
    x = np.zeros((2, 2), np.float32)
    keep, plan = _np_plan()
    assert _run_np(plan, [x], geometry([x]), 0) == -2
    with pytest.raises(SimulatorError, match="QPARITY_THREADS"):
        ex.run({"x": _batches(1, seed=15)[0]})


def test_a_raw_view_holds_no_reference_and_reads_the_memory():
    import torch

    t = torch.arange(24, dtype=torch.int16).reshape(2, 3, 4).permute(0, 2, 1)[:, 1:]
    v = raw_view(t)
    np.testing.assert_array_equal(v, t.numpy())
    t.add_(1)
    np.testing.assert_array_equal(v, t.numpy())


def test_a_batch_splits_chunks_take_the_fast_run_too(monkeypatch):
    """Chunks of a split batch reach each executor's run_batch as numpy slices of one
    geometry: after the first runs the plan from numpy serves them (until every executor
    has one: then all chunks go in one call, tests/simulator/runtime/test_fast_chunks.py),
    and the batch's outputs stay the whole batch's."""
    from simulator.runtime import split
    from tests.simulator.runtime.test_split import _batch, _whole
    from tests.simulator.runtime.test_split import _program as _split_program

    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 64)  # 2 samples of 32 bytes a chunk
    prog = _split_program()
    ex = Executor(prog)
    served = []
    real = FastRun.run
    monkeypatch.setattr(
        FastRun, "run", lambda self, *a: served.append(real(self, *a)) or served[-1]
    )
    whole = FastChunks.run
    monkeypatch.setattr(
        FastChunks, "run", lambda self, *a: served.append(whole(self, *a)) or served[-1]
    )
    for seed in range(8):
        x = _batch(8, seed)
        np.testing.assert_array_equal(ex.run({"x": x})[0]["y"], _whole(prog, x))
    assert any(r is not None for r in served[-4:])
    assert "batch split" in ex.last_path


def test_the_fast_run_leaves_the_callers_thread_count_as_it_was(monkeypatch):
    """qp_run_fast sets the kernels' thread count for the calls and restores it after."""
    lib = native.library()
    ex = _warm(_program())
    before = lib.qp_threads(3)
    try:
        assert _served(ex, _batches(1, seed=14)[0], monkeypatch)
        assert lib.qp_threads(0) == 3
    finally:
        lib.qp_threads(before)


def test_inputs_a_mapping_makes_as_they_are_read_stay_alive_through_the_call(monkeypatch):
    """The C side reads each input by its object's address: a mapping whose get() makes a
    new array each time (nothing else holds it) still gets the kernels' outputs."""
    from collections.abc import Mapping

    class Fresh(Mapping):
        def __init__(self, x):
            self.x = x

        def __getitem__(self, k):
            return self.x.copy()

        def __iter__(self):
            return iter(["x"])

        def __len__(self):
            return 1

    prog = _program()
    ex = _warm(prog)
    got, real = [], FastRun.run
    monkeypatch.setattr(FastRun, "run", lambda self, *a: got.append(real(self, *a)) or got[-1])
    for x in _batches(4, seed=16):
        _assert_same(ex.run(Fresh(x))[0], _fresh(prog, x)[0])
        assert got[-1] is not None  # the fast run served it
