"""simulator.runtime.frozen: a program run from its frozen plan gives exactly what its kernels
give, and every case the plan cannot cover runs instruction by instruction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.program.isa import Instruction, Op, Program
from simulator.runtime import native
from simulator.runtime.executor import KERNELS, Executor
from simulator.runtime.frozen import ALIGN, Frozen, place

pytestmark = pytest.mark.skipif(native.library() is None, reason="no compiled kernels here")
Q = {"rounding": "half_even", "out_dtype": "int8", "relu": 0}


def _program(dequantize: bool = True) -> Program:
    """quantize -> linear -> transpose (a view) -> reshape (a compiled copy) -> add of the
    copy and a reshape of the linear's output (a view) -> dequantize: calls, views and a
    program output."""
    rng = np.random.default_rng(0)
    instrs = [
        Instruction(
            Op.QUANTIZE,
            ("x",),
            ("q",),
            (),
            {"scale": 0.05, "dtype": "int8", "rounding": "half_even"},
            ("quant",),
        ),  # fmt: skip
        Instruction(Op.LINEAR, ("q",), ("l",), ("w", "b", "m", "s"), Q, ("fc",)),
        Instruction(
            Op.LAYOUT, ("l",), ("t",), (), {"op_type": "Transpose", "perm": [1, 0]}, ("t",)
        ),  # fmt: skip
        Instruction(Op.LAYOUT, ("t",), ("r",), ("shape",), {"op_type": "Reshape"}, ("r",)),
        Instruction(Op.LAYOUT, ("l",), ("v",), ("shape",), {"op_type": "Reshape"}, ("v",)),
        Instruction(Op.ADD, ("r", "v"), ("a",), ("ma", "mb", "sh"), Q, ("add",)),
    ]
    if dequantize:
        instrs.append(Instruction(Op.DEQUANTIZE, ("a",), ("y",), (), {"scale": [0.5]}, ("dq",)))
    consts = {
        "w": rng.integers(-128, 128, (8, 8)).astype(np.int8), "b": np.zeros(8, np.int32),
        "m": np.array([1 << 14]), "s": np.array([20]), "shape": np.array([-1, 16]),
        "ma": np.array([3]), "mb": np.array([5]), "sh": np.array([3]),
    }  # fmt: skip
    out = "y" if dequantize else "a"
    return Program("nash-e", {"x": {"dtype": "float32"}}, {out: {}}, instrs, consts,
                   captures={"fc": "l", "add": "a"})  # fmt: skip


def _batches(n: int, seed: int = 1, rows: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 3, (rows, 8)).astype(np.float32) for _ in range(n)]


def _fresh(prog: Program, x: np.ndarray, capture: bool = False):
    return Executor(prog).run({"x": x}, capture=capture)


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].dtype == v.dtype
        np.testing.assert_array_equal(got[k], v)


@pytest.mark.parametrize("dequantize", [True, False], ids=["float-output", "int8-output"])
def test_frozen_runs_equal_the_kernels(dequantize):
    prog = _program(dequantize)
    ex = Executor(prog, timings=True)
    for x in _batches(8):
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
    assert isinstance(ex._frozen, Frozen)
    timed = [i for i, _, _ in ex.timings]  # frozen: instructions with calls, views cost 0
    assert timed == sorted(set(timed)) and 2 not in timed and {0, 1, 3, 5} <= set(timed)
    # the quantized input is dead after the linear: the copy (or the add) reuses its memory
    spare = sum(b.untyped_storage().nbytes() for b in ex._frozen.buffers)
    assert ex._frozen.arena.numel() < spare


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 20), st.integers(0, 20)),
                max_size=12))  # fmt: skip
def test_place_never_overlaps_buffers_in_use_together(items):
    """Against the obvious check: every pair of buffers whose use ranges meet is apart."""
    spec = {k: (n, min(a, b), max(a, b)) for k, (n, a, b) in enumerate(items)}
    offsets, size = place(spec)
    for k, (n, first, last) in spec.items():
        assert offsets[k] % ALIGN == 0 and offsets[k] + n <= size
        for j, (m, f2, l2) in spec.items():
            if j != k and first <= l2 and f2 <= last:  # in use at one call
                assert offsets[k] + n <= offsets[j] or offsets[j] + m <= offsets[k]


@pytest.mark.parametrize("dequantize", [True, False], ids=["float-output", "int8-output"])
def test_captures_run_every_instruction_and_held_captures_keep_their_values(dequantize):
    """capture=True bypasses the plan; captures still held (views of the replays' buffers)
    keep their values: the plan writes its arena, and steps aside while a capture views a
    buffer its outputs use (int8-output: the capture of the add is the program output)."""
    prog = _program(dequantize)
    ex = Executor(prog)
    xs = _batches(9, seed=2)
    for x in xs[:5]:
        ex.run({"x": x})
    assert isinstance(ex._frozen, Frozen)
    kept = [(x, ex.run({"x": x}, capture=True)) for x in xs[5:7]]
    for x in xs[7:]:
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
    for x, (outs, caps) in kept:
        want_outs, want_caps = _fresh(prog, x, capture=True)
        _assert_same(outs, want_outs)
        _assert_same(caps, want_caps)


def test_another_geometry_runs_instruction_by_instruction():
    prog = _program()
    ex = Executor(prog)
    xs = _batches(5) + _batches(2, rows=6) + _batches(3, seed=3)
    for x in xs:
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
    bad = Executor(prog)
    for x in _batches(5):
        bad.run({"x": x})
    with pytest.raises(Exception, match="input x has shape|shape"):
        bad.run({"x": np.zeros((3, 7), np.float32)})


def test_a_changed_return_value_abandons_the_plan_for_that_run():
    """QUANTIZE reports a non-finite input: the run goes instruction by instruction."""
    prog = _program()
    ex = Executor(prog)
    for x in _batches(5):
        ex.run({"x": x})
    assert isinstance(ex._frozen, Frozen)
    bad = _batches(1, seed=4)[0]
    bad[2, 3] = np.inf
    _assert_same(ex.run({"x": bad})[0], _fresh(prog, bad)[0])
    x = _batches(1, seed=5)[0]
    _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])


def test_an_add_of_a_constant_broadcast_over_rows_is_frozen():
    """A ViT's ``x + pos``: QAdd of the rows and a ``[1, C]`` constant. The constant is
    read as it is, so the add replays and the program freezes (expanded, it was a fresh
    copy each run, and no plan was ever built)."""
    instrs = [
        Instruction(Op.QUANTIZE, ("x",), ("q",), (),
                    {"scale": 0.05, "dtype": "int8", "rounding": "half_even"}, ("quant",)),
        Instruction(Op.ADD, ("q",), ("a",), ("pos", "ma", "mb", "sh"), Q, ("add",)),
    ]  # fmt: skip
    consts = {"pos": np.arange(-4, 4, dtype=np.int8).reshape(1, 8) * 9,
              "ma": np.array([3]), "mb": np.array([5]), "sh": np.array([3])}  # fmt: skip
    prog = Program("nash-e", {"x": {"dtype": "float32"}}, {"a": {}}, instrs, consts)
    ex = Executor(prog)
    for x in _batches(6):
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
    assert isinstance(ex._frozen, Frozen)


def test_an_instruction_without_a_replay_means_no_plan(monkeypatch):
    """A torch-only kernel (here ADD made to skip the compiled path) is never frozen."""
    kernel = KERNELS[Op.ADD]
    monkeypatch.setitem(KERNELS, Op.ADD, lambda i, b, c: [t.clone() for t in kernel(i, b, c)])
    prog = _program()
    ex = Executor(prog)
    for x in _batches(6):
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
    assert ex._frozen is None


def test_buffers_past_the_memory_budget_are_allocated_per_run(monkeypatch):
    """With no bytes left to hold between runs nothing is held, so nothing is frozen."""
    from simulator.runtime import replay

    monkeypatch.setattr(replay, "HOLD_TOTAL", 64)  # the quantize's 64 bytes, not the rest
    prog = _program()
    ex = Executor(prog)
    for x in _batches(6):
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
    assert ex._frozen is False
    held = [s.held for s in ex.replays._state.values() if isinstance(s, replay._Calls)]
    assert sum(map(bool, held)) == 1


def test_a_buffer_made_outside_the_replays_means_no_plan():
    """An nhwc LUT whose table maps 0 elsewhere gets its padding channels re-zeroed in a
    new tensor after each run; the max-pool reading it points outside the held buffers,
    so no plan is frozen (it would point at the first run's copy)."""
    from simulator.arith.lut import build_direct_table
    from simulator.program.isa import Layout
    from tests.simulator.runtime.test_executor import _encoded

    lut = build_direct_table("exp", np.exp(np.arange(-128, 128) * 0.02), 0.02, 0.05, "int8",
                             "half_even")  # fmt: skip
    lut_attrs, lut_inits = _encoded("Lut", lut)
    nhwc, pool = {"layout": "nhwc"}, {"kernel_shape": [2, 2], "strides": [2, 2]}
    instrs = [
        Instruction(Op.LAYOUT, ("x",), ("xn",), (), {"op_type": "ToNHWC", "channels_padded": 16}),
        Instruction(Op.LUT, ("xn",), ("t",), ("t0", "t1", "t2", "t3"), {**lut_attrs, **nhwc}),
        Instruction(Op.MAXPOOL, ("t",), ("p",), (), {**pool, **nhwc}),
        Instruction(Op.LAYOUT, ("p",), ("y",), (), {"op_type": "ToNCHW", "channels": 3}),
    ]
    consts = {f"t{i}": a for i, a in enumerate(lut_inits)}
    layouts = {b: Layout("nhwc", 3, 16) for b in ("xn", "t", "p")}
    prog = Program("nash-e", {"x": {"dtype": "int8"}}, {"y": {}}, instrs, consts, layouts)
    ex, rng = Executor(prog), np.random.default_rng(6)
    for _ in range(7):
        x = rng.integers(-128, 128, (2, 3, 6, 8)).astype(np.int8)
        _assert_same(ex.run({"x": x})[0], _fresh(prog, x)[0])
    assert ex._frozen is False


def test_a_plan_of_views_only_runs_without_the_compiled_library(monkeypatch):
    """A program whose instructions are all views freezes into a plan with no calls, which
    must not need the compiled runner (QPARITY_NATIVE=0, or no compiler)."""
    monkeypatch.setattr(native, "library", lambda: None)
    transpose = {"op_type": "Transpose", "perm": [1, 0]}
    instrs = [Instruction(Op.LAYOUT, ("x",), ("t",), (), transpose, ("t",))]
    prog = Program("nash-e", {"x": {"dtype": "float32"}}, {"t": {}}, instrs, {})
    ex = Executor(prog)
    for x in _batches(6):
        np.testing.assert_array_equal(ex.run({"x": x})[0]["t"], x.T)
    assert isinstance(ex._frozen, Frozen) and not ex._frozen.calls


def test_a_batch_of_224x224_feature_maps_is_held_and_frozen():
    """A 6.4 MB buffer (ResNet-18's first conv output at batch 8, 224x224) is held between
    runs, so the program still freezes (held only up to 4 MB, batch 8 replayed instruction
    by instruction, allocating that buffer every run)."""
    x = np.arange(8 * 112 * 112 * 64, dtype=np.int64).astype(np.int8).reshape(8, 112, 112, 64)
    clip = Instruction(Op.CLIP, ("x",), ("y",), (), {"lo": -3, "hi": 5}, ("clip",))
    prog = Program("nash-e", {"x": {"shape": list(x.shape), "dtype": "int8"}}, {"y": {}},
                   [clip], {})  # fmt: skip
    ex = Executor(prog)
    for _ in range(5):  # learn (2), replay and freeze, then the plan
        np.testing.assert_array_equal(ex.run({"x": x})[0]["y"], np.clip(x, -3, 5))
    assert ex.last_path == "frozen plan"
