"""The compiled int8 convolution (simulator/csrc/qconv.c) against the reference integer ops
(CUSTOM_OPS QConv, and QConv into QAdd for the fused add), and the library's build."""

from __future__ import annotations

import contextlib
import ctypes
import mmap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.errors import SimulatorError
from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.kernels import exec_native
from simulator.kernels.exec_epilogue import Epilogue
from simulator.program.isa import Instruction, Op, Program
from simulator.runtime import native
from simulator.runtime.executor import Executor
from tests.simulator.kernels.test_exec_conv import EMPTY, MODES, _nhwc_program

pytestmark = [pytest.mark.skipif(native.library() is None, reason=native.status()),
              pytest.mark.usefixtures("pool_threads")]  # conftest.py: 1 and 3 threads


NEEDS_AMX = pytest.mark.skipif(
    not native.amx_supported(),
    reason=f"AMX-INT8 kernels (qamx.c, qamxconv.c) not tested here: LINEAR runs on "
    f"{native.linear_kernel()}",
)


@pytest.fixture(params=["vnni", pytest.param("amx", marks=NEEDS_AMX)])
def conv_path(request, monkeypatch) -> str:
    """Each int8 conv test on both kernels of an AMX host (QPARITY_AMX=0: qconv.c; 1:
    qamxconv.c's tiles, for every conv: the small ones too); elsewhere the build's own
    kernel, the AMX case skipped, saying so."""
    monkeypatch.setenv("QPARITY_AMX", "1" if request.param == "amx" else "0")
    monkeypatch.setattr(exec_native, "AMX_CONV_MIN", (0, 0))
    return request.param


def _native_plans(prog, feeds) -> tuple[np.ndarray, list]:
    ex = Executor(prog)
    with native.tracing() as trace:
        out = ex.run(feeds)[0]["out"]
    plans = [v for k, v in ex.consts.derived.items() if k[0] == "conv_plan"]
    plans = [p.native for p in plans if p is not None]
    names = {fn.__name__ for fn, _, _ in trace.calls}
    if plans and plans[0] is not None and "qp_dwconv" not in names:  # the path asked for ran
        tiles = native.amx() and plans[0].in_dtype == torch.int8
        if not tiles or exec_native.AMX_CONV_MIN == (0, 0):  # conv_path: every conv's kernel
            assert ("qp_conv_amx" in names) == tiles and ("qp_conv" in names) != tiles, names
    return out, plans


@st.composite
def conv_cases(draw):
    """A random conv: int8 or int16 input, int8 / int16 / int32 output, channels across
    16-lane blocks, any geometry, extreme values."""
    c, o = draw(st.integers(1, 37)), draw(st.sampled_from([1, 5, 16, 17, 32, 40, 64, 70, 96, 160]))
    k = draw(st.sampled_from([(1, 1), (3, 3), (2, 3), (5, 1)]))
    strides, dil = (
        draw(st.lists(st.integers(1, 3), min_size=2, max_size=2)),
        [draw(st.integers(1, 2)), draw(st.integers(1, 2))],
    )
    pads = draw(st.lists(st.integers(0, 2), min_size=4, max_size=4))
    need = [(k[i] - 1) * dil[i] + 1 - pads[i] - pads[i + 2] for i in (0, 1)]
    h, w = (draw(st.integers(max(n, 1), max(n, 1) + 9)) for n in need)
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    dt = draw(st.sampled_from([np.int8, np.int16]))
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    x = rng.integers(lo, hi + 1, (draw(st.integers(1, 3)), c, h, w)).astype(dt)
    x.reshape(-1)[rng.random(x.size) < 0.1] = lo  # the extreme (the uint8 offset's edge)
    wt = rng.integers(-128, 128, (o, c, *k), dtype=np.int8)
    if dt == np.int8 and draw(st.booleans()):  # after a ReLU (the AVX2 build's vpmaddubsw form)
        x = np.abs(x.astype(np.int16)).clip(0, 127).astype(np.int8)
        x.reshape(-1)[rng.random(x.size) < 0.1] = 127  # 127 x -128, twice: 32512 per int16 pair
        wt.reshape(-1)[rng.random(wt.size) < 0.2] = -128
    attrs = {"rounding": draw(st.sampled_from(MODES)), "relu": draw(st.integers(0, 1)),
             "strides": strides, "pads": pads, "dilations": dil, "group": 1,
             "out_dtype": draw(st.sampled_from(["int8", "int16", "int32"]))}  # fmt: skip
    bias = rng.integers(-(2**15), 2**15, o)
    if attrs["out_dtype"] == "int32":  # no requantize: acc + bias, relu
        return x, wt, bias, EMPTY, EMPTY, attrs, rng
    if draw(st.booleans()):  # a float32 epilogue: |acc * mult| < 2**23 (module docstring)
        while (top := _acc_bound(x, wt, bias)) >= 2**21:
            wt, bias = (wt / 2).astype(np.int8), bias // 2  # toward 0: reaches 0
        mult = rng.integers(1, max(2**23 // top, 2), o)
    elif x.dtype == np.int16 or draw(st.booleans()):  # float32 scales: mode 3 within bounds
        mult = rng.integers(1, 2**20, o)
    else:  # odd multipliers past 2**24: not float32, the float64 modes
        mult = rng.integers(2**24, 2**25, o) | 1
    shift = rng.integers(8, 24, o) + np.log2(mult.max()).astype(int)
    return x, wt, bias, mult, shift, attrs, rng


def _acc_bound(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> int:
    col = int(np.abs(w.astype(np.int64)).reshape(len(w), -1).sum(1).max())
    return col * -int(np.iinfo(x.dtype).min) + int(np.abs(bias).max())


def _magic32(a: int, scale: np.ndarray, rounding: str) -> bool:
    """qepi.h's mode 3 applies (exec_native.magic32): half_even, every accumulator and every
    scale a float32, the products below 2**22."""
    exact = (scale.astype(np.float32).astype(np.float64) == scale).all()
    return rounding == "half_even" and a < 2**24 and exact and a * scale.max() < 2**22


def _o_pad(o: int) -> int:
    return -(-o // 16) * 16


ONE_PATH = [HealthCheck.function_scoped_fixture]  # conv_path holds for all of a test's examples


@settings(max_examples=60, deadline=None, suppress_health_check=ONE_PATH)
@given(case=conv_cases())
def test_native_conv_equals_qconv(case, conv_path):
    x, w, bias, mult, shift, attrs, _ = case
    o, c = w.shape[:2]
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    prog = _nhwc_program(x, w, [bias, mult, shift], attrs, c_pad=_o_pad(c), o_pad=_o_pad(o))
    got, plans = _native_plans(prog, {"x": x})
    assert len(plans) == 1 and plans[0] is not None
    per_group = 4 if x.dtype == np.int8 else 2  # a pixel off the 4-byte grid runs as row runs
    runs = w.shape[3] > 1 and c % per_group != 0 and attrs["dilations"][1] == 1
    assert plans[0].row_runs == runs
    if mult.size:
        a = _acc_bound(x, w, bias)
        f32 = a * int(mult.max()) < 2 ** (23 + (attrs["rounding"] == "half_even"))
        magic = _magic32(a, mult * 2.0 ** -shift.astype(np.float64), attrs["rounding"])
        assert plans[0].scale.dtype == (torch.float32 if f32 or magic else torch.float64)
        assert plans[0].mode == 3 if magic else plans[0].mode in ((0,) if f32 else (1, 2))
    else:
        assert plans[0].scale is None
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


def _padded_conv(x, w, rounding_out: tuple[str, str], m: int, shift: int):
    """A 3x3 pad-1 QConv of two output channels with multiplier ``m`` and ``shift`` for
    both: (QConv's integers, the native kernel's, the kernel's plans)."""
    mode, out_dtype = rounding_out
    attrs = {"rounding": mode, "relu": 0, "strides": [1, 1], "pads": [1, 1, 1, 1],
             "dilations": [1, 1], "group": 1, "out_dtype": out_dtype}  # fmt: skip
    consts = [np.zeros(2, np.int64), np.full(2, m), np.full(2, shift)]
    want = CUSTOM_OPS["QConv"].evaluate([x, w, *consts], attrs)
    prog = _nhwc_program(x, w, consts, attrs, c_pad=_o_pad(x.shape[1]))
    got, plans = _native_plans(prog, {"x": x})
    return want, got, plans


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("below", [True, False])
def test_magic_rounding_only_below_its_limit(mode, below, conv_path):
    """The float64 epilogue rounds by adding 1.5 * 2**52 (qepi.h's mode 2) only for
    half_even and ``acc_bound * max scale`` below 2**30; just below and just above it, with
    halves to round (``scale = m / 2``, odd m) and outputs past int16, both exact."""
    c, k = 8, 3
    a = c * k * k * 128 * 128  # acc_bound with no bias
    m = (2**30 - 1) * 2 // a if below else 2**31 // a + 1
    m += 1 - m % 2 if below else m % 2 == 0  # odd, still on its side of the limit
    m = m - 2 if below and a * m >= 2**31 else m
    rng = np.random.default_rng(3)
    x = rng.integers(-1, 2, (1, c, 6, 6)).astype(np.int8)  # small sums: halves unclamped
    x[..., :3, :3] = -128  # the first output pixels reach the bound
    w = np.full((2, c, k, k), -128, np.int8)
    w[1] = rng.integers(-2, 3, (c, k, k))
    want, got, plans = _padded_conv(x, w, (mode, "int16"), m, 1)
    assert [p.mode for p in plans] == [2 if below and mode == "half_even" else 1]
    inside = np.abs(want) < 2**15 - 1
    assert (~inside).any() and (want[inside] % 2).any()  # clamped ones, and odd unclamped ones
    np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None, suppress_health_check=ONE_PATH)
@given(case=conv_cases(), per_channel=st.booleans())
def test_native_fused_conv_add_equals_qconv_then_qadd(case, per_channel, conv_path):
    x, w, bias, _, _, attrs, rng = case
    attrs = {**attrs, "out_dtype": "int16" if attrs["out_dtype"] == "int32" else attrs["out_dtype"]}
    o, c = w.shape[:2]
    acc = CUSTOM_OPS["QConv"].evaluate([x, w, bias, EMPTY, EMPTY],
                                       {**attrs, "out_dtype": "int32", "relu": 0})  # fmt: skip
    bdt = (np.int8, np.int16, np.int32)[int(rng.integers(0, 3))]  # int32: an accumulator
    b = rng.integers(np.iinfo(bdt).min, np.iinfo(bdt).max, acc.shape, dtype=bdt, endpoint=True)
    ma = rng.integers(-(2**10), 2**10, (o, 1, 1)) if per_channel else rng.integers(1, 2**10, (1,))
    mb, sh = rng.integers(-(2**14), 2**14, (1,)), np.array([int(rng.integers(8, 30))])
    want = CUSTOM_OPS["QAdd"].evaluate([acc, b, ma, mb, sh], attrs)
    consts = [bias, EMPTY, EMPTY, ma.reshape(-1), mb, sh]
    prog = _nhwc_program(x, w, consts, attrs, b=b, c_pad=_o_pad(c), o_pad=_o_pad(o))
    got, plans = _native_plans(prog, {"x": x, "b": b})
    assert plans and all(p is not None for p in plans)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("below", [True, False])
def test_float32_epilogue_only_below_its_limit(mode, below, conv_path):
    """``|acc * m|`` just below the float32 limit runs in float32, at it in float64; both
    exact on inputs that reach the bound (all -128 against all -128 weights)."""
    limit = 2**24 if mode == "half_even" else 2**23
    c, k = 8, 3
    a = c * k * k * 128 * 128  # acc_bound with no bias
    m = (limit - 1) // a if below else limit // a + 1
    x = np.full((1, c, 5, 5), -128, np.int8)
    w = np.full((2, c, k, k), -128, np.int8)
    w[1] = 127
    want, got, plans = _padded_conv(x, w, (mode, "int8"), m, 22)
    magic = mode == "half_even"  # past the limit, half_even still runs in float32: mode 3
    assert [p.scale.dtype for p in plans] == [torch.float32 if below or magic else torch.float64]
    assert [p.mode for p in plans] == [3 if magic else 0 if below else 1]
    np.testing.assert_array_equal(got, want)


MAGIC32_CASES = {  # name: (input channels, multiplier, shift, mode); A = channels * 9 * 2**14
    "accumulators below 2**24": (113, 1, 3, 3),
    "accumulators at 2**24": (114, 1, 3, 2),
    "products below 2**22": (8, 27, 3, 3),  # A * 27 / 8 = 0.95 * 2**22 (A * 27 > 2**24)
    "products past 2**22": (8, 29, 3, 2),
    "a scale that is no float32": (8, 2**24 + 1, 29, 2),
}


@pytest.mark.parametrize("case", MAGIC32_CASES)
def test_float32_magic_rounding_only_within_its_bounds(case, conv_path):
    """qepi.h's mode 3 (one float32 FMA adds 1.5 * 2**23 to the exact product) only while
    every accumulator and scale is a float32 and the products stay below 2**22; just inside
    and just past each bound, with halves to round and outputs past int16, both exact."""
    c, m, shift, mode = MAGIC32_CASES[case]
    rng = np.random.default_rng(c + m)
    x = rng.integers(-1, 2, (1, c, 6, 6)).astype(np.int8)  # small sums: halves unclamped
    x[..., :3, :3] = -128  # the first output pixels reach the bound
    w = np.full((2, c, 3, 3), -128, np.int8)
    w[1] = rng.integers(-2, 3, (c, 3, 3))
    want, got, plans = _padded_conv(x, w, ("half_even", "int16"), m, shift)
    assert [p.mode for p in plans] == [mode]
    inside = np.abs(want) < 2**15 - 1
    assert (~inside).any() and (want[inside] % 2).any()  # clamped ones, and odd unclamped ones
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("in_dtype,b_dtype", [(np.int32, None), (np.int32, np.int8)])
def test_int32_input_stays_on_the_torch_path(in_dtype, b_dtype):
    rng = np.random.default_rng(3)
    x, w = rng.integers(-128, 128, (1, 4, 5, 5)).astype(in_dtype), np.ones((3, 4, 3, 3), np.int8)
    attrs = {"rounding": "half_even", "relu": 0, "strides": [1, 1], "pads": [0, 0, 0, 0],
             "dilations": [1, 1], "group": 1, "out_dtype": "int8"}  # fmt: skip
    if b_dtype is None:
        consts = [np.zeros(3, np.int64), np.full(3, 5), np.full(3, 3)]
        want = CUSTOM_OPS["QConv"].evaluate([x, *([w] + consts)], attrs)
        got, plans = _native_plans(_nhwc_program(x, w, consts, attrs), {"x": x})
    else:
        b = rng.integers(-999, 999, (1, 3, 3, 3)).astype(b_dtype)
        consts = [np.zeros(3, np.int64), EMPTY, EMPTY, np.ones(1, np.int64), np.ones(1, np.int64),
                  np.array([2])]  # fmt: skip
        acc = CUSTOM_OPS["QConv"].evaluate(
            [x, w, consts[0], EMPTY, EMPTY], {**attrs, "out_dtype": "int32"}
        )
        want = CUSTOM_OPS["QAdd"].evaluate([acc, b, *consts[3:]], attrs)
        got, plans = _native_plans(_nhwc_program(x, w, consts, attrs, b=b), {"x": x, "b": b})
    assert all(p is None for p in plans)
    np.testing.assert_array_equal(got, want)


LINEAR_CASES = dict(
    rows=st.lists(st.integers(1, 9), min_size=1, max_size=3), k=st.integers(1, 90),
    o=st.integers(1, 40), per_channel=st.booleans(), mode=st.sampled_from(MODES),
    out_dtype=st.sampled_from(["int8", "int16", "int32"]), relu=st.integers(0, 1),
    wide=st.booleans(), seed=st.integers(0, 2**31),
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(**LINEAR_CASES)
def test_native_linear_on_vnni_equals_qlinear(**case):
    """QPARITY_AMX=0: the AVX-512 VNNI kernel, on every machine that has the kernels."""
    _linear_case("0", **case)


@NEEDS_AMX
@settings(max_examples=40, deadline=None)
@given(**LINEAR_CASES)
def test_native_linear_on_amx_equals_qlinear(**case):
    """The AMX-INT8 tiles; skipped, with the reason, on a CPU without AMX."""
    _linear_case("1", **case)


def _linear_case(amx, rows, k, o, per_channel, mode, out_dtype, relu, wide, seed) -> None:
    """One random LINEAR on the path ``amx`` selects (K <= 90: within AMX_K_MAX) against
    the reference QLinear, integers and dtype."""
    rng = np.random.default_rng(seed)
    dt = np.int16 if wide else np.int8
    x = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, (*rows, k)).astype(dt)
    w = rng.integers(-128, 128, (o, k), dtype=np.int8)
    bias = rng.integers(-(2**15), 2**15, o) if seed % 3 else EMPTY
    n = o if per_channel else 1
    mult, shift = rng.integers(1, 2**15, n), rng.integers(0, 30, n)
    if out_dtype == "int32":
        mult, shift = EMPTY, EMPTY
    attrs = {"rounding": mode, "out_dtype": out_dtype, "relu": relu}
    want = CUSTOM_OPS["QLinear"].evaluate([x, w, bias, mult, shift], attrs)
    instr = Instruction(Op.LINEAR, ("x",), ("out",), ("w", "b", "m", "s"), attrs, ("fc",))
    consts = {"w": w, "b": bias, "m": mult, "s": shift}
    with _amx_spy(amx) as tiles:
        ex = Executor(Program("nash-e", {"x": {}}, {"out": {}}, [instr], consts))
        got = ex.run({"x": x})[0]["out"]
    plans = [v for key, v in ex.consts.derived.items() if key[0] == "linear_native"]
    assert len(plans) == 1 and plans[0] is not None
    assert tiles == [amx == "1"]  # the path asked for is the path that ran
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


def _extreme_case(rng, x_shape, w_shape):
    """int8 inputs and weights with a fifth of each at -128 (the offset's edge)."""
    x = rng.integers(-128, 128, x_shape).astype(np.int8)
    x.reshape(-1)[rng.random(x.size) < 0.2] = -128
    wt = rng.integers(-128, 128, w_shape, dtype=np.int8)
    wt.reshape(-1)[rng.random(wt.size) < 0.2] = -128
    return x, wt


def _on_tiles(prog, x) -> tuple[np.ndarray, list]:
    """The program run with QPARITY_AMX=1; qamxconv.c must have run its conv."""
    with pytest.MonkeyPatch.context() as mp, native.tracing() as trace:
        mp.setenv("QPARITY_AMX", "1")
        got, plans = _native_plans(prog, {"x": x})
    assert "qp_conv_amx" in {fn.__name__ for fn, _, _ in trace.calls}
    return got, plans


@NEEDS_AMX
@pytest.mark.parametrize("c,c_pad", [(24, 24), (96, 96), (64, 64), (24, 32), (144, 160)])
@pytest.mark.parametrize("nhw", [(1, 1, 1), (1, 3, 11), (2, 4, 8), (2, 10, 10)])
@pytest.mark.parametrize("mode", MODES)
def test_amx_loads_an_unpadded_1x1_conv_as_it_lies(c, c_pad, nhw, mode):
    """An unpadded stride-1 1x1 conv: qamxconv.c loads the pixels themselves into its tiles
    (raw int8 read in place by TDPBSSD when the stored channels are the kernel's, the
    offset copy by TDPBUSD when more are stored), gathering only the input's last tile:
    1, 33, 64 and 200 pixels (every tile gathered; one read in place and one gathered; ...),
    rows of 24, 96 and 144 bytes (the last 64-byte chunk reads into the next pixel) and 64.
    Extremes everywhere: -128 inputs against -128 weights; the same integers as QConv."""
    rng = np.random.default_rng(c * 1000 + sum(nhw))
    n, h, w = nhw
    x, wt = _extreme_case(rng, (n, c, h, w), (80, c, 1, 1))
    attrs = {"rounding": mode, "relu": 0, "strides": [1, 1], "pads": [0, 0, 0, 0],
             "dilations": [1, 1], "group": 1, "out_dtype": "int8"}  # fmt: skip
    consts = [rng.integers(-(2**15), 2**15, 80), rng.integers(1, 2**10, 80), np.full(80, 18)]
    want = CUSTOM_OPS["QConv"].evaluate([x, wt, *consts], attrs)
    prog = _nhwc_program(x, wt, consts, attrs, c_pad=c_pad, o_pad=80)
    got, plans = _on_tiles(prog, x)
    assert plans and exec_native.amx_kp(plans[0], [1, 1], [0] * 4) == -(-c // 64) * 64
    np.testing.assert_array_equal(got, want)


@NEEDS_AMX
@pytest.mark.parametrize("c,kernel,dil,pads", [
    (64, (3, 3), [1, 1], [1, 1, 1, 1]), (128, (2, 3), [1, 1], [0, 1, 1, 0]),
    (64, (3, 3), [2, 2], [2, 2, 2, 2]), (64, (5, 1), [1, 1], [0, 0, 0, 0]),
    (192, (3, 3), [1, 1], [0, 0, 0, 0])])  # fmt: skip
@pytest.mark.parametrize("nhw", [(1, 5, 5), (2, 9, 7), (1, 16, 16), (3, 6, 4)])
def test_amx_reads_a_stride_1_conv_off_its_padded_grid(c, kernel, dil, pads, nhw):
    """A stride-1 conv whose taps are whole 64-byte chunks: qamxconv.c loads each tap's
    rows from the padded input at consecutive grid positions (the columns past the output
    width computed, not stored), gathering only tiles whose rows would read past the input;
    padded (the offset copy, TDPBUSD) and unpadded (raw int8 in place, TDPBSSD) inputs,
    dilations, maps smaller than a tile and several images. The same integers as QConv."""
    rng = np.random.default_rng(c + sum(nhw) + sum(pads))
    n, h, w = nhw
    x, wt = _extreme_case(rng, (n, c, h, w), (64, c, *kernel))
    attrs = {"rounding": "half_even", "relu": 1, "strides": [1, 1], "pads": pads,
             "dilations": dil, "group": 1, "out_dtype": "int8"}  # fmt: skip
    consts = [rng.integers(-(2**15), 2**15, 64), rng.integers(1, 2**10, 64), np.full(64, 22)]
    want = CUSTOM_OPS["QConv"].evaluate([x, wt, *consts], attrs)
    prog = _nhwc_program(x, wt, consts, attrs, c_pad=c, o_pad=64)
    got, _ = _on_tiles(prog, x)
    np.testing.assert_array_equal(got, want)


@NEEDS_AMX
@pytest.mark.parametrize("pixels", [33, 34, 40, 64])
def test_amx_in_place_reads_stop_at_the_inputs_end(pixels):
    """A 1x1 conv of 24 channels read in place, its input ending at a page that cannot be
    read: a tile's rows read kp = 64 bytes from each 24-byte pixel, so the tiles near the
    end must be gathered (one pixel after the tile is not enough: 40 bytes past the last
    row's pixel). A read past the end is a crash; the integers are qp_conv's."""
    page, c = mmap.PAGESIZE, 24
    buf = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + page), page, 0) == 0  # PROT_NONE
    size = pixels * c
    x = torch.frombuffer(buf, dtype=torch.int8, count=size, offset=page - size)
    x.copy_(torch.randint(-128, 128, (size,), dtype=torch.int8))
    x = x.view(1, 1, pixels, c)
    nc = _plan(torch.randint(-128, 128, (c, 80), dtype=torch.int8), c, kernel=(1, 1))
    outs = []
    for amx, xin in (("0", x.clone()), ("1", x)):
        out = torch.empty(1, 1, pixels, 80, dtype=torch.int8)
        with pytest.MonkeyPatch.context() as mp, native.tracing() as trace:
            mp.setenv("QPARITY_AMX", amx)
            exec_native.run(nc, ([1, 1], [0, 0, 0, 0], [1, 1]), xin, None, out)
        assert ("qp_conv_amx" in {fn.__name__ for fn, _, _ in trace.calls}) == (amx == "1")
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


@NEEDS_AMX
@pytest.mark.parametrize("bound,b_dtype", [(2**20, None), (2**30, None), (2**20, torch.int8)])
@pytest.mark.parametrize("pixels,pads", [(40, [0, 0, 0, 0]), (35, [1, 1, 1, 1])])
@pytest.mark.parametrize("o,o_pad", [(72, 80), (88, 96)])
def test_amx_epilogues_write_padding_channels_as_zero(bound, b_dtype, pixels, pads, o, o_pad):
    """o output channels stored o_pad apart into an output full of garbage, clamped from 3,
    on the tiles and by qp_conv: the same bytes, and 0 in the padding channels. The
    epilogue's float32 magic rounding (bound 2**20: qepi.h mode 3, loaded once per run of
    rows stored at consecutive pixels, two channel blocks to one store: 88 channels end in
    the second block of a pair, 72 in a block of its own), its float64 one (mode 2) and a
    fused int8 add; an unpadded 1x1 conv (every tile's rows consecutive pixels) and a padded
    3x3 one (rows past the output width)."""
    rng, c = np.random.default_rng(pixels + bound % 7 + o), 64
    kernel = (1, 1) if not any(pads) else (3, 3)
    wmat = torch.randint(-128, 128, (kernel[0] * kernel[1] * c, o), dtype=torch.int8)
    scale_b = None if b_dtype is None else torch.full((1,), 0.75, dtype=torch.float64)
    epi = Epilogue(None, torch.full((1,), 2.0**-12, dtype=torch.float64), scale_b, 3, 127,
                   torch.int8, "half_even")  # lo 3 (a Clip from 3): unmasked padding lanes hold 3
    nc = exec_native.plan(wmat, kernel, c, torch.int8, epi, None, b_dtype, bound, 2**30)
    assert nc.mode == (3 if bound < 2**24 and b_dtype is None else 2)
    shape = (1, 5, pixels // 5, c) if any(pads) else (1, 1, pixels, c)
    x = torch.from_numpy(rng.integers(-128, 128, shape).astype(np.int8))
    b = None if b_dtype is None else torch.randint(-128, 128, (*x.shape[:3], o_pad), dtype=b_dtype)
    outs = []
    for amx in "01":
        out = torch.full((*x.shape[:3], o_pad), 0x55, dtype=torch.int8)
        with pytest.MonkeyPatch.context() as mp, native.tracing() as trace:
            mp.setenv("QPARITY_AMX", amx)
            exec_native.run(nc, ([1, 1], pads, [1, 1]), x, b, out)
        assert ("qp_conv_amx" in {fn.__name__ for fn, _, _ in trace.calls}) == (amx == "1")
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert not outs[1][..., o:].any()


def _plan(wmat, channels: int, in_dtype=torch.int8, kernel=(3, 3)):
    """A conv's kernel plan, int8 requantized output (scale 2**-12, float64), small bounds."""
    epi = Epilogue(None, torch.full((1,), 2.0**-12, dtype=torch.float64), None, -128, 127,
                   torch.int8, "half_even")  # fmt: skip
    return exec_native.plan(wmat, kernel, channels, in_dtype, epi, None, None, 2**20, 2**30)


PADDED = ([1, 1], [1, 1, 1, 1])  # stride 1, padded: never the in-place 1x1 form


def test_amx_takes_int8_convs_from_its_minimum(monkeypatch):
    """Any machine (native.amx stubbed on): 64-byte taps and 4 output blocks go to the
    tiles, with K rounded up to 64; 16-byte taps, 3 blocks or int16 inputs stay on qp_conv."""
    monkeypatch.setattr(native, "amx", lambda: True)
    wmat = torch.zeros(3 * 3 * 64, 64, dtype=torch.int8)
    assert exec_native.amx_kp(_plan(wmat, 64), *PADDED) == 9 * 64
    assert exec_native.amx_kp(_plan(wmat[: 9 * 16], 16), *PADDED) is None  # 16-byte taps
    assert exec_native.amx_kp(_plan(wmat[:, :48], 64), *PADDED) is None  # 3 blocks of 16 channels
    assert exec_native.amx_kp(_plan(wmat, 64, torch.int16), *PADDED) is None
    one = _plan(wmat[:16, :16], 16, kernel=(1, 1))  # 16-byte taps, one block
    assert exec_native.amx_kp(one, [1, 1], [0] * 4) == 64  # read in place: always tiles
    assert exec_native.amx_kp(one, [2, 2], [0] * 4) is None  # strided: gathered
    assert exec_native.amx_kp(one, [1, 1], [0, 1, 0, 1]) is None  # padded: gathered
    monkeypatch.setattr(exec_native, "AMX_CONV_MIN", (0, 0))
    rgb = _plan(wmat[: 9 * 3], 3)  # row runs: 3 taps of 3 pixels x 3 channels (12 bytes)
    assert rgb.row_runs and exec_native.amx_kp(rgb, *PADDED) == 64
    monkeypatch.setattr(native, "amx", lambda: False)
    assert exec_native.amx_kp(_plan(wmat, 64), *PADDED) is None


def test_linear_kernel_names_the_path_that_runs(monkeypatch):
    monkeypatch.setenv("QPARITY_AMX", "0")
    build = native.build_name()  # "AVX-512 VNNI" or "AVX2"
    assert native.linear_kernel() == f"{build} (QPARITY_AMX=0)" or not native.amx_supported()
    monkeypatch.setenv("QPARITY_AMX", "1")
    tiles = native.linear_kernel().startswith("AMX-INT8 tiles")
    assert tiles == native.amx() == native.amx_supported()
    assert tiles or native.linear_kernel().startswith(f"{build} (this CPU lacks AMX-INT8")


@contextlib.contextmanager
def _amx_spy(on: str):
    """QPARITY_AMX set to ``on``; yields the list of whether each linear ran on tiles."""
    ran, real = [], exec_native._amx
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QPARITY_AMX", on)
        mp.setattr(exec_native, "_amx", lambda *a: ran.append(real(*a)) or ran[-1])
        yield ran


@pytest.mark.parametrize("dt", [np.int8, np.int16])
def test_linear_rows_past_the_amx_buffers(dt):
    """K = 600 pads to 640 > AMX_K_MAX, past qamx.c's buffers: int8 rows run as a 1x1 conv
    on qamxconv.c's tiles where AMX runs (20 channels: below AMX_CONV_MIN's blocks, so
    patched), int16 rows on qp_conv; the same integers."""
    rng = np.random.default_rng(3)
    x = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, (37, 600)).astype(dt)
    w = rng.integers(-8, 8, (20, 600), dtype=np.int8)
    mult, shift = rng.integers(1, 2**10, 20), np.full(20, 16 if dt == np.int8 else 24)
    attrs = {"rounding": "half_even", "out_dtype": "int8", "relu": 0}
    instr = Instruction(Op.LINEAR, ("x",), ("out",), ("w", "b", "m", "s"), attrs, ("fc",))
    consts = {"w": w, "b": EMPTY, "m": mult, "s": shift}
    with _amx_spy("1") as tiles, native.tracing() as trace, pytest.MonkeyPatch.context() as mp:
        mp.setattr(exec_native, "AMX_CONV_MIN", (0, 0))
        got = Executor(Program("nash-e", {"x": {}}, {"out": {}}, [instr], consts)).run({"x": x})
    assert tiles == [False]
    names = {fn.__name__ for fn, _, _ in trace.calls}
    conv_tiles = native.amx() and dt == np.int8
    assert ("qp_conv_amx" in names) == conv_tiles and ("qp_conv" in names) != conv_tiles
    want = CUSTOM_OPS["QLinear"].evaluate([x, w, EMPTY, mult, shift], attrs)
    np.testing.assert_array_equal(got[0]["out"], want)


def test_pack_weights_layout():
    """``packed[i, j, c // 4, o // 16, o % 16, c % 4] = wmat[(i, j, c), o]``, zeros elsewhere."""
    wmat = (
        torch.arange(2 * 3 * 5 * 18).reshape(2 * 3 * 5, 18).remainder(251).sub(125).to(torch.int8)
    )
    packed, cs, blocks = exec_native.pack_weights(wmat, (2, 3), 5)
    assert (cs, blocks, packed.shape) == (8, 2, (2, 3, 2, 2, 16, 4))
    w4 = wmat.reshape(2, 3, 5, 18)
    for i, j, c, o in np.ndindex(2, 3, 8, 32):
        want = int(w4[i, j, c, o]) if c < 5 and o < 18 else 0
        assert int(packed[i, j, c // 4, o // 16, o % 16, c % 4]) == want


def test_a_missing_compiler_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(SimulatorError, match="no C compiler"):
        native.build(tmp_path / "other")


def test_build_failure_names_the_command(tmp_path, monkeypatch):
    fake = tmp_path / "cc"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo fake && exit 0\necho boom >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(SimulatorError, match="failed: boom") as err:
        native.build(tmp_path / "out")
    assert "install a C compiler" in str(err.value)  # says what to do
    assert not list((tmp_path / "out").glob("*"))  # no half-written library left behind


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_the_stems_pad_copy_writes_inside_its_rows_only(channels):
    """qp_pad's 4-byte moves of a 1-3 channel stem (stored 4 channels a pixel) end inside
    each row: the 4 slack bytes after the buffer keep what they held. (1 channel used to
    write 2 bytes past the row, over the next row's first pixels when another thread had
    written it first: the digits ViT's patch conv at batch 100 differed from quantized.onnx
    at the first pixel of sample 50, the threads' seam.)"""
    n, h, w, cx = 3, 5, 7, 4
    x = torch.randint(-128, 128, (n, h, w, cx), dtype=torch.int8)
    size = n * h * w * channels
    xs = torch.full((size + 4,), 0x55, dtype=torch.uint8)
    native.library().qp_pad(native.ptr(x), 0, n, h, w, cx, channels, 0, 0, 0, 0, channels,
                            native.ptr(xs))  # fmt: skip
    offset = native.library().qp_pad_offset()  # 0x80, or 0 (AVX2: raw)
    want = (x[..., :channels].view(torch.uint8) ^ offset).reshape(-1)
    assert torch.equal(xs[:size], want)
    assert xs[size:].tolist() == [0x55] * 4  # nothing written past the last row


@pytest.mark.parametrize(
    "c, k, pads",
    [(1, (3, 3), [1, 1, 1, 1]), (3, (7, 7), [3, 3, 3, 3]), (8, (1, 1), [0, 0, 0, 0]),
     (8, (3, 3), [1, 1, 1, 1])],
)  # fmt: skip
def test_a_non_negative_input_at_the_int16_pair_bound_is_exact(c, k, pads):
    """Inputs in [0, 127] (after a ReLU) run the AVX2 build's vpmaddubsw form: 127 against
    -128 everywhere puts every int16 pair sum at -32512, the bound that keeps it exact; a
    stem's row runs (1 and 3 channels, padded copy), a padded 3x3 and an unpadded 1x1 (read
    in place), int32 output (no requantize: the sums themselves) against QConv."""
    rng = np.random.default_rng(c)
    x = np.full((2, c, 9, 9), 127, np.int8)
    x[:, :, ::3] = rng.integers(0, 128, x[:, :, ::3].shape)  # some rows below the bound
    w = np.full((20, c, *k), -128, np.int8)
    bias = rng.integers(-(2**15), 2**15, 20)
    attrs = {"rounding": "half_even", "relu": 0, "strides": [1, 1], "pads": pads,
             "dilations": [1, 1], "group": 1, "out_dtype": "int32"}  # fmt: skip
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, EMPTY, EMPTY], attrs)
    prog = _nhwc_program(x, w, [bias, EMPTY, EMPTY], attrs, c_pad=_o_pad(c), o_pad=32)
    got, plans = _native_plans(prog, {"x": x})
    assert len(plans) == 1
    np.testing.assert_array_equal(got, want)
