"""simulator.runtime.packed and csrc/qplan.c: kernel calls as int64 slots, run by one ctypes call."""

from __future__ import annotations

import ctypes
import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.runtime import native, packed

needs_kernels = pytest.mark.skipif(native.library() is None, reason=native.status())


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_double_slot_holds_its_bits(v):
    bits = packed.slot(ctypes.c_double, v)
    back = struct.unpack("<d", struct.pack("<q", bits))[0]
    assert back == v or (math.isnan(v) and math.isnan(back))
    assert math.copysign(1.0, back) == math.copysign(1.0, v)


def test_pointer_and_integer_slots():
    arr = native.int64s(3, 4, 5)
    assert packed.slot(ctypes.c_void_p, arr) == ctypes.addressof(arr)
    assert packed.slot(ctypes.c_void_p, ctypes.c_void_p(4096)) == 4096
    assert packed.slot(ctypes.c_void_p, ctypes.c_void_p(None)) == 0
    assert packed.slot(ctypes.c_void_p, None) == 0
    assert packed.slot(ctypes.c_int64, -(2**40)) == -(2**40)


def test_the_wrappers_follow_the_signatures():
    """One declaration and wrapper per kernel (the runners have none); the table in
    native.PACKED's order."""
    src = packed.source(native.SIGNATURES)
    runners = set(packed.RUNNERS)
    assert not runners & set(native.PACKED)
    assert len(native.PACKED) == len(native.SIGNATURES) - len(runners)
    for name in native.PACKED:
        assert src.count(f"static int64_t w_{name}(") == 1
    table = src[src.index("qp_packed[]") :]
    entries = table[table.index("{") + 1 : table.index("}")].split(",")
    assert [t.strip().removeprefix("w_") for t in entries] == list(native.PACKED)
    assert "d_(a[7]), d_(a[8])" in src  # qp_quantize's lo and hi: doubles from their bits


def _run(calls: list[tuple[str, list]], inputs=(), fills=()) -> int:
    """``qp_run_plan`` on ``calls`` ((kernel, args) each): the index it stopped at."""
    kernel, start, slots, rc = [], [], [], []
    for name, args in calls:
        kernel.append(native.PACKED.index(name))
        start.append(len(slots))
        types = native.SIGNATURES[name][0]
        slots += [packed.slot(t, a) for t, a in zip(types, args, strict=True)]
        rc.append(0)
    group = list(range(len(calls)))  # one instruction per call
    t = [torch.tensor(v, dtype=torch.int64) for v in (kernel, start, slots, rc, list(fills), group)]
    ins = (ctypes.c_int64 * max(len(inputs), 1))(*inputs)
    secs = torch.zeros(len(calls), dtype=torch.float64)
    done = native.library().qp_run_plan(len(calls), *map(native.ptr, t[:4]), len(fills) // 3,
                                        native.ptr(t[4]), ctypes.addressof(ins), native.ptr(t[5]),
                                        native.ptr(secs))  # fmt: skip
    assert bool((secs[:done] > 0).all())
    return done


@needs_kernels
def test_the_runner_calls_kernels_as_ctypes_does():
    """QUANTIZE (doubles, an int return) from slots equals the direct call; an input
    pointer set by a fill; a call returning another value than recorded stops the run."""
    x = torch.tensor([0.26, -1.5, 2.5, 1e6, -3.49], dtype=torch.float32)
    s = torch.tensor([0.5], dtype=torch.float64)
    want = torch.empty(5, dtype=torch.int8)
    args = [x, 0, 1, 1, 5, s, 1, -128.0, 127.0, want, 0]
    ptrs = [native.ptr(a) if isinstance(a, torch.Tensor) else a for a in args]
    assert native.library().qp_quantize(*ptrs) == 0
    got = torch.empty(5, dtype=torch.int8)
    slots = [
        native.ptr(a) if isinstance(a, torch.Tensor) else a for a in [None, *args[1:9], got, 0]
    ]
    assert _run([("qp_quantize", slots)], inputs=[x.data_ptr()], fills=[0, 0, 0]) == 1
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert got.tolist() == [1, -3, 5, 127, -7]
    x[0] = float("nan")  # QUANTIZE then returns 1: not what the plan recorded
    assert _run([("qp_quantize", slots)] * 2, inputs=[x.data_ptr()], fills=[0, 0, 0]) == 0
