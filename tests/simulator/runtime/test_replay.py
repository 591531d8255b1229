"""simulator.runtime.replay: an instruction replayed from its first runs gives exactly what its
kernel gives, and anything a replay could get wrong keeps the kernel instead."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from simulator.program.isa import Instruction, Op, Program
from simulator.runtime import native
from simulator.runtime import replay as rp
from simulator.runtime.executor import KERNELS, Executor

pytestmark = pytest.mark.skipif(native.library() is None, reason="no compiled kernels here")
LINEAR_ATTRS = {"rounding": "half_even", "out_dtype": "int8", "relu": 0}


def _copy_kernel(post=None, pointer=None):
    """A kernel that copies its input with the compiled strided copy, then ``post(out)``;
    ``pointer(x)`` picks the tensor whose pointer the copy reads."""

    def kernel(instr, bufs, consts):
        x = bufs[instr.inputs[0]]
        src = x if pointer is None else pointer(x)
        out = native.empty(src.shape, src.dtype)
        shape = native.int64s(1, 1, 1, 1, 1, src.numel())
        stride = native.int64s(0, 0, 0, 0, 0, 1)
        native.library().qp_copy(native.ptr(src), x.element_size(), shape, stride, native.ptr(out))
        if post is not None:
            post(out)
        return [out]

    return kernel


def _one(op: Op, attrs=None, consts=()) -> Program:
    names = tuple(f"c{i}" for i in range(len(consts)))
    instr = Instruction(op, ("x",), ("y",), names, attrs or {}, ("L0",))
    return Program("nash-e", {"x": {}}, {"y": {}}, [instr], dict(zip(names, consts, strict=True)))


def _runs(ex: Executor, xs) -> list[np.ndarray]:
    return [ex.run({"x": x})[0]["y"] for x in xs]


def _data(n: int, seed: int, shape=(4, 6)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(n)]


def test_a_copy_is_replayed_on_new_values(monkeypatch):
    monkeypatch.setitem(KERNELS, Op.CLIP, _copy_kernel())
    ex, xs = Executor(_one(Op.CLIP)), _data(5, 0)
    got = _runs(ex, xs)
    assert 0 in ex.replays
    for x, y in zip(xs, got, strict=True):
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize(
    "post",
    [lambda out: out[0].fill_(7), lambda out: out.add_(1)],
    ids=["overwrite-a-row", "torch-step-after-the-call"],
)
def test_a_torch_step_after_the_calls_keeps_the_kernel(monkeypatch, post):
    monkeypatch.setitem(KERNELS, Op.CLIP, _copy_kernel(post))
    ex, xs = Executor(_one(Op.CLIP)), _data(5, 1)
    for x, y in zip(xs, _runs(ex, xs), strict=True):
        want = torch.from_numpy(x.copy())
        post(want)
        np.testing.assert_array_equal(y, want.numpy())
    assert 0 not in ex.replays


def test_a_pointer_to_a_copy_made_per_run_keeps_the_kernel(monkeypatch):
    """``x.clone()`` is neither an input, a buffer nor the same constant in both runs."""
    monkeypatch.setitem(KERNELS, Op.CLIP, _copy_kernel(pointer=lambda x: x.clone()))
    ex, xs = Executor(_one(Op.CLIP)), _data(4, 2)
    for x, y in zip(xs, _runs(ex, xs), strict=True):
        np.testing.assert_array_equal(y, x)
    assert 0 not in ex.replays


def test_a_view_into_the_input_keeps_the_kernel(monkeypatch):
    """A pointer into the input past its start is not the input's data pointer; with the
    same input array twice it is the same address in both runs, but not the same object."""
    monkeypatch.setitem(KERNELS, Op.CLIP, _copy_kernel(pointer=lambda x: x[1:]))
    ex, (x0, *rest) = Executor(_one(Op.CLIP)), _data(3, 9)
    xs = [x0, x0, *rest, x0]
    for x, y in zip(xs, _runs(ex, xs), strict=True):
        np.testing.assert_array_equal(y, x[1:])
    assert 0 not in ex.replays


def test_a_constant_pointer_is_replayed_as_recorded(monkeypatch):
    table = torch.arange(24, dtype=torch.int8).reshape(4, 6)
    monkeypatch.setitem(KERNELS, Op.CLIP, _copy_kernel(pointer=lambda x: table))
    ex = Executor(_one(Op.CLIP))
    for y in _runs(ex, _data(4, 3)):
        np.testing.assert_array_equal(y, table.numpy())
    assert 0 in ex.replays


def test_a_new_geometry_before_the_second_run_restarts_the_learning(monkeypatch):
    monkeypatch.setitem(KERNELS, Op.CLIP, _copy_kernel())
    ex = Executor(_one(Op.CLIP))
    xs = _data(1, 10, (2, 5)) + _data(4, 11)
    for x, y in zip(xs, _runs(ex, xs), strict=True):
        np.testing.assert_array_equal(y, x)
    assert 0 in ex.replays


def test_another_geometry_runs_the_kernel(monkeypatch):
    monkeypatch.setitem(KERNELS, Op.CLIP, _copy_kernel())
    ex = Executor(_one(Op.CLIP))
    xs = _data(3, 4) + _data(2, 5, (2, 5)) + _data(1, 6)
    for x, y in zip(xs, _runs(ex, xs), strict=True):
        assert y.shape == x.shape
        np.testing.assert_array_equal(y, x)


def test_outputs_still_held_are_never_reused():
    """A replay reuses its last buffers only once nothing refers to them: outputs the caller
    kept (numpy arrays of the executor's buffers) keep their values."""
    w = np.random.default_rng(7).integers(-128, 128, (6, 6)).astype(np.int8)
    consts = (w, np.zeros(6, np.int32), np.array([1 << 14]), np.array([20]))
    ex = Executor(_one(Op.LINEAR, LINEAR_ATTRS, consts))
    xs = _data(6, 8)
    held = _runs(ex, xs)
    assert 0 in ex.replays
    fresh = [Executor(_one(Op.LINEAR, LINEAR_ATTRS, consts)).run({"x": x})[0]["y"] for x in xs]
    for y, want in zip(held, fresh, strict=True):
        np.testing.assert_array_equal(y, want)


def test_a_changed_return_value_runs_the_kernel(monkeypatch):
    """QUANTIZE's kernel reports a non-finite input; a replay seeing another return value
    than recorded falls back to the kernel, which handles it as a first run does."""
    ran, kernel = [], KERNELS[Op.QUANTIZE]
    monkeypatch.setitem(KERNELS, Op.QUANTIZE, lambda *a: ran.append(1) or kernel(*a))
    prog = _one(Op.QUANTIZE, {"scale": 0.5, "dtype": "int8", "rounding": "half_even"})
    ex = Executor(prog)
    xs = [np.linspace(-40, 40, 24, dtype=np.float32).reshape(4, 6) * k for k in (1, -1, 2)]
    _runs(ex, xs)
    assert 0 in ex.replays and len(ran) == 2
    bad = xs[0].copy()
    bad[1, 2] = np.nan
    (got,) = _runs(ex, [bad])
    assert len(ran) == 3
    np.testing.assert_array_equal(got, Executor(prog).run({"x": bad})[0]["y"])


def test_inputs_sharing_memory_are_part_of_the_key():
    """The same buffer as both operands, then two different ones, of the same geometry."""
    a = torch.arange(24, dtype=torch.int8).reshape(4, 6)
    b = torch.flip(a, (0,)).contiguous()
    key_same, key_two = rp.input_key([a, a]), rp.input_key([a, b])
    assert key_same != key_two


@pytest.mark.skipif(rp._USE_COUNT is None, reason="this torch has no storage use count")
def test_unshared_storage_agrees_with_unshared_as_views_come_and_go():
    """unshared_storage(storage_id(t)) is unshared(t): alone, with a tensor view, with a
    numpy view, and alone again once they are gone."""
    t = torch.zeros(16, dtype=torch.int32)
    sid = rp.storage_id(t)
    assert rp.unshared(t) and rp.unshared_storage(sid)
    view = t[4:]
    assert not rp.unshared(t) and not rp.unshared_storage(sid)
    del view
    array = t.numpy()
    assert not rp.unshared(t) and not rp.unshared_storage(sid)
    del array
    assert rp.unshared(t) and rp.unshared_storage(sid)
