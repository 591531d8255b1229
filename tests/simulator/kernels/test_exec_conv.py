"""The blocked nhwc conv (real channels, fused epilogue) and the fused conv + add against
the reference integer ops (CUSTOM_OPS QConv / QAdd)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.kernels import exec_conv, exec_native
from simulator.kernels import exec_kernels as ek
from simulator.program.isa import Instruction, Layout, Op, Program
from simulator.runtime import native
from simulator.runtime.executor import Executor
from tests.simulator.arith.test_kernels import rand_ints

MODES = ("half_even", "bpu_round")
EMPTY = np.zeros(0, np.int64)


@pytest.fixture(autouse=True, params=["native", "torch"])
def conv_kernels(request, monkeypatch):
    """Every test twice: int8 convs through the compiled kernel (when it builds here) and
    through the torch im2col + GEMM path (test_exec_native.py tests the kernel itself)."""
    if request.param == "torch":
        monkeypatch.setattr(exec_native, "plan", lambda *a, **k: None)
    return request.param


def _pad(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return np.pad(a, widths)


def _nhwc_program(x, w, consts: list, attrs: dict, b=None, c_pad=16, o_pad=16) -> Program:
    """ToNHWC(x[, b]) -> CONV nhwc (weights packed [O_pad, kh, kw, C_pad]) -> ToNCHW."""
    o, c = w.shape[:2]
    packed = _pad(_pad(w.transpose(0, 2, 3, 1), 0, o_pad), 3, c_pad)
    per_ch = [a if a.size <= 1 else _pad(a.reshape(-1), 0, o_pad) for a in consts]
    names = ["w"] + [f"k{i}" for i in range(len(per_ch))]
    ins = ("xn",) if b is None else ("xn", "bn")
    instrs = [Instruction(Op.LAYOUT, ("x",), ("xn",), (), {"op_type": "ToNHWC", "channels_padded": c_pad}),
              Instruction(Op.CONV, ins, ("y",), tuple(names), {**attrs, "layout": "nhwc"}, ("conv",)),
              Instruction(Op.LAYOUT, ("y",), ("out",), (), {"op_type": "ToNCHW", "channels": o})]  # fmt: skip
    inputs = {"x": {"shape": list(x.shape), "dtype": str(x.dtype)}}
    layouts = {"xn": Layout("nhwc", c, c_pad), "y": Layout("nhwc", o, o_pad)}
    if b is not None:
        instrs.insert(1, Instruction(Op.LAYOUT, ("b",), ("bn",), (),
                                     {"op_type": "ToNHWC", "channels_padded": o_pad}))  # fmt: skip
        inputs["b"] = {"shape": list(b.shape), "dtype": str(b.dtype)}
        layouts["bn"] = Layout("nhwc", o, o_pad)
    return Program(
        "nash-e",
        inputs,
        {"out": {}},
        instrs,
        dict(zip(names, [packed, *per_ch], strict=True)),
        layouts,
    )


def _run(prog: Program, feeds: dict) -> tuple[np.ndarray, bool]:
    """(output, whether the blocked fast path ran)."""
    ex = Executor(prog)
    out = ex.run(feeds)[0]["out"]
    plans = [v for k, v in ex.consts.derived.items() if k[0] == "conv_plan"]
    return out, any(p is not None for p in plans)


def _case(rng, one_by_one: bool = False):
    c, o = int(rng.integers(1, 6)), int(rng.integers(1, 7))
    k = 1 if one_by_one else int(rng.choice([1, 2, 3, 5]))
    x = rand_ints(rng, (int(rng.integers(1, 4)), c, *rng.integers(k, 11, 2).tolist()), np.int8)
    w = rand_ints(rng, (o, c, k, k), np.int8)
    attrs = {"rounding": str(rng.choice(MODES)), "relu": int(rng.integers(0, 2)),
             "strides": rng.integers(1, 3, 2).tolist(), "pads": rng.integers(0, 3, 4).tolist(),
             "dilations": [int(rng.integers(1, 3)), 1] if k < 3 else [1, 1], "group": 1}  # fmt: skip
    return x, w, rng.integers(-5000, 5000, o), attrs


@pytest.mark.parametrize("seed", range(16))
def test_blocked_conv_equals_qconv(seed, monkeypatch):
    """Real channels only, small blocks (bands of rows), every dtype and rounding."""
    monkeypatch.setattr(exec_conv, "BLOCK_ELEMS", int([7, 50, 2**17][seed % 3]))
    rng = np.random.default_rng(seed)
    x, w, bias, attrs = _case(rng, one_by_one=seed % 5 == 0)
    o = w.shape[0]
    attrs["out_dtype"] = ["int8", "int16", "int32"][seed % 3]
    mult, shift = rng.integers(1, 2**15, o), rng.integers(0, 20, o)
    if attrs["out_dtype"] == "int32" and seed % 2:
        mult, shift = EMPTY, EMPTY
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    got, fast = _run(_nhwc_program(x, w, [bias, mult, shift], attrs), {"x": x})
    assert fast
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


@pytest.mark.parametrize("seed", range(12))
def test_fused_conv_add_equals_qconv_then_qadd(seed, monkeypatch):
    """y = QAdd(QConv(x) as int32, b): nhwc (blocked fast path) and plain (int64 path)."""
    monkeypatch.setattr(exec_conv, "BLOCK_ELEMS", int([9, 2**17][seed % 2]))
    rng = np.random.default_rng(100 + seed)
    x, w, bias, attrs = _case(rng)
    conv = {**attrs, "out_dtype": "int32", "relu": 0}
    acc = CUSTOM_OPS["QConv"].evaluate([x, w, bias, EMPTY, EMPTY], conv)
    b = rand_ints(rng, acc.shape, [np.int8, np.int16, np.int32][seed % 3])
    o = w.shape[0]
    ma = rng.integers(-(2**14), 2**14, (o, 1, 1)) if seed % 2 else rng.integers(1, 2**14, (1,))
    mb, sh = rng.integers(-(2**14), 2**14, (1,)), np.array([int(rng.integers(0, 24))])
    out = {**attrs, "out_dtype": str(rng.choice(["int8", "int16"]))}
    want = CUSTOM_OPS["QAdd"].evaluate([acc, b, ma, mb, sh], out)
    consts = [bias, EMPTY, EMPTY, ma.reshape(-1), mb, sh]
    got, fast = _run(_nhwc_program(x, w, consts, out, b=b), {"x": x, "b": b})
    assert fast  # |acc * ma| + |b * mb| < 2**52 even for an int32 b
    np.testing.assert_array_equal(got, want)
    names = ("w", *(f"k{i}" for i in range(6)))
    plain_consts = dict(zip(names, [w, bias, EMPTY, EMPTY, ma, mb, sh], strict=True))
    instr = Instruction(Op.CONV, ("x", "b"), ("y",), names, out, ("conv", "add"))
    plain = Program("nash-e", {"x": {}, "b": {}}, {"y": {}}, [instr], plain_consts)
    np.testing.assert_array_equal(Executor(plain).run({"x": x, "b": b})[0]["y"], want)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5), oh=st.integers(1, 9), ow=st.integers(1, 9), target=st.integers(1, 90))
def test_blocks_cover_every_output_row_once(n, oh, ow, target):
    seen = np.zeros((n, oh), int)
    for n0, n1, h0, h1 in exec_conv.blocks(n, oh, ow, target):
        seen[n0:n1, h0:h1] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("seed", range(12))
def test_im2col_view_equals_windows(seed):
    """Every channel count (1..5, and 2/4/8/16/24 bytes per pixel: the int16 / int32 /
    int64 widened views) and dtype gives the rows of the plain window view."""
    rng = np.random.default_rng(seed)
    kernel = rng.integers(1, 4, 2).tolist()
    strides, dil = rng.integers(1, 3, 2).tolist(), [int(rng.integers(1, 3)), 1 + seed % 2]
    c = int(rng.choice([1, 2, 3, 4, 5, 8, 16, 24]))
    dt = [np.int8, np.int16][seed % 3 == 2]
    x = torch.from_numpy(rand_ints(rng, (2, 9, 10, c), dt))
    ref = ek.windows(x, (1, 2), kernel, strides, dil).permute(0, 1, 2, 4, 5, 3)
    got = exec_conv.im2col_view(x, kernel, strides, dil)
    assert got.shape[:3] == ref.shape[:3]
    rows = exec_conv.im2col_rows(got[:, 1:], x.dtype)
    assert rows.dtype == x.dtype
    assert torch.equal(rows, ref[:, 1:].reshape(rows.shape[0], -1))


@pytest.mark.parametrize("c", [1, 2, 3, 8, 16, 24])
@pytest.mark.parametrize("n", [1, 3])
def test_im2col_view_of_a_one_pixel_map_permuted_to_nhwc(n, c):
    """A ``[N, C, 1, 1]`` map (a squeeze-excite's pooled vector) permuted to NHWC: torch
    calls it contiguous though its H and W strides are 1, and the widened view of its
    pixels must still give the rows of the plain window view."""
    x = torch.from_numpy(rand_ints(np.random.default_rng(c), (n, c, 1, 1), np.int8))
    x = x.permute(0, 2, 3, 1)
    assert x.is_contiguous() and x.stride()[1:3] == (1, 1)
    ref = ek.windows(x, (1, 2), [1, 1], [1, 1], [1, 1]).permute(0, 1, 2, 4, 5, 3)
    rows = exec_conv.im2col_rows(exec_conv.im2col_view(x, [1, 1], [1, 1], [1, 1]), x.dtype)
    assert torch.equal(rows, ref.reshape(n, c))


@pytest.mark.parametrize("seed", range(8))
def test_fused_clip_equals_qconv_then_qclip(seed):
    """A QClip compile fused into the conv (attrs ``clip``, a ReLU6): the reference, the
    blocked path (or the compiled kernel) and the int64 path (plain layout) all equal
    QConv then QClip."""
    rng = np.random.default_rng(300 + seed)
    x, w, bias, attrs = _case(rng)
    o = w.shape[0]
    attrs["out_dtype"] = ["int8", "int16"][seed % 2]
    mult, shift = rng.integers(1, 2**15, o), rng.integers(0, 20, o)
    lo, hi = [(0, 6), (0, 100), (-3, 0), (-40, 17)][seed % 4]
    consts = [bias, mult, shift]
    y = CUSTOM_OPS["QConv"].evaluate([x, w, *consts], attrs)
    want = CUSTOM_OPS["QClip"].evaluate([y], {"lo": lo, "hi": hi})
    assert (want != y).any()  # the clip changes some outputs
    clipped = {**attrs, "clip": [lo, hi]}
    np.testing.assert_array_equal(CUSTOM_OPS["QConv"].evaluate([x, w, *consts], clipped), want)
    got, fast = _run(_nhwc_program(x, w, consts, clipped), {"x": x})
    assert fast
    np.testing.assert_array_equal(got, want)
    instr = Instruction(Op.CONV, ("x",), ("y",), ("w", "b", "m", "s"), clipped, ("conv", "clip"))
    plain = Program(
        "nash-e", {"x": {}}, {"y": {}}, [instr], dict(zip("wbms", [w, *consts], strict=True))
    )
    np.testing.assert_array_equal(Executor(plain).run({"x": x})[0]["y"], want)


@pytest.mark.parametrize("mode", MODES)
def test_conv_beyond_the_float64_bound_keeps_the_int64_path(mode):
    """int16 input and 31-bit multipliers: ``acc * mult`` may pass 2**52, no fast path."""
    rng = np.random.default_rng(7)
    x, w = rand_ints(rng, (2, 3, 6, 6), np.int16), rand_ints(rng, (4, 3, 3, 3), np.int8)
    attrs = {"rounding": mode, "relu": 0, "out_dtype": "int16", "group": 1,
             "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1]}  # fmt: skip
    bias, mult, shift = rng.integers(-99, 99, 4), np.full(4, 2**31 - 1), np.full(4, 40)
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    got, fast = _run(_nhwc_program(x, w, [bias, mult, shift], attrs), {"x": x})
    assert not fast
    np.testing.assert_array_equal(got, want)


def _plans(prog: Program, feeds: dict) -> tuple[np.ndarray, list]:
    ex = Executor(prog)
    out = ex.run(feeds)[0]["out"]
    return out, [v for k, v in ex.consts.derived.items() if k[0] == "conv_plan"]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("near_limit", [False, True])
def test_direct_float32_conv_equals_qconv(seed, near_limit, conv_kernels):
    """Short im2col runs (1 int16 channel) take the one-float32-convolution path while
    ``acc_bound < 2**24``: int16 inputs at their extremes with weights scaled to put the
    bound just below (near_limit) or just above 2**24 (then im2col + the float64 GEMM)."""
    rng = np.random.default_rng(seed)
    c, k = 1, 3 if near_limit or seed % 2 == 0 else 2
    x = rand_ints(rng, (2, c, 7, 6), np.int16)
    x[0, :, ::2], x[1, :, 1::2] = -32768, 32767
    per_tap = min(2**24 // 32768 // (k * k), 127)  # sum |w| * 32768 near 2**24
    w = np.full((3, c, k, k), per_tap, dtype=np.int8)
    w[1] = -per_tap
    if near_limit:  # sum |w| = 511 (bound 2**24 - 2**15) or 512 (= 2**24: no direct path)
        w[2, 0, 0, 0] += 2**24 // 32768 - per_tap * k * k - (seed % 4 != 1)
    attrs = {"rounding": MODES[seed % 2], "relu": seed % 2, "out_dtype": "int16", "group": 1,
             "strides": [1 + seed % 2, 1], "pads": [1, 0, seed % 3, 1],
             "dilations": [1, 1 + seed % 2]}  # fmt: skip
    bias, mult, shift = rng.integers(-99, 99, 3), rng.integers(1, 2**10, 3), np.full(3, 20)
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    got, plans = _plans(_nhwc_program(x, w, [bias, mult, shift], attrs), {"x": x})
    direct = not (near_limit and seed % 4 == 1)
    if conv_kernels == "native" and native.library() is not None:  # it takes int16 inputs
        direct = False
    assert all(p is not None and (p.w_f32 is not None) == direct for p in plans)
    np.testing.assert_array_equal(got, want)
