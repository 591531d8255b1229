"""The compiled depthwise convolution (csrc/qdw.c) against the reference QConv: same integers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.kernels import exec_depthwise
from simulator.program.isa import Instruction, Layout, Op, Program
from simulator.runtime import native
from simulator.runtime.executor import Executor
from tests.simulator.arith.test_kernels import rand_ints

pytestmark = [pytest.mark.skipif(native.library() is None, reason=f"kernels {native.status()}"),
              pytest.mark.usefixtures("pool_threads")]  # conftest.py: 1 and 3 threads


def _program(x, w, bias, mult, shift, attrs, plain: bool = False) -> Program:
    """ToNHWC -> depthwise CONV (nhwc, weights [C, kh, kw, 1]) -> ToNCHW; ``plain``: ToNHWC
    -> ToNCHW (a view of NHWC memory) -> CONV in the plain layout (ONNX weights), as the
    compiler lays out grouped convs."""
    c = x.shape[1]
    if plain:
        consts = {"w": w, "b": bias, "m": mult, "s": shift}
        instrs = [
            Instruction(
                Op.LAYOUT, ("x",), ("xn",), (), {"op_type": "ToNHWC", "channels_padded": c}
            ),  # fmt: skip
            Instruction(Op.LAYOUT, ("xn",), ("xp",), (), {"op_type": "ToNCHW", "channels": c}),
            Instruction(Op.CONV, ("xp",), ("out",), ("w", "b", "m", "s"), attrs, ("dw",)),
        ]
        return Program("nash-e", {"x": {"shape": list(x.shape), "dtype": "int8"}},
                       {"out": {}}, instrs, consts, {"xn": Layout("nhwc", c, c)})  # fmt: skip
    consts = {"w": w.transpose(0, 2, 3, 1).copy(), "b": bias, "m": mult, "s": shift}
    instrs = [
        Instruction(Op.LAYOUT, ("x",), ("xn",), (), {"op_type": "ToNHWC", "channels_padded": c}),
        Instruction(
            Op.CONV, ("xn",), ("y",), ("w", "b", "m", "s"), {**attrs, "layout": "nhwc"}, ("dw",)
        ),  # fmt: skip
        Instruction(Op.LAYOUT, ("y",), ("out",), (), {"op_type": "ToNCHW", "channels": c}),
    ]
    layouts = {n: Layout("nhwc", c, c) for n in ("xn", "y")}
    return Program("nash-e", {"x": {"shape": list(x.shape), "dtype": "int8"}}, {"out": {}},
                   instrs, consts, layouts)  # fmt: skip


@pytest.mark.parametrize("seed", range(10))
def test_depthwise_conv_equals_qconv(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    # channels inside, at and across the kernel's 16-lane halves and 32-channel blocks
    c, k = [5, 16, 37, 32, 3, 20, 48, 33, 23, 96][seed], [3, 3, 5, 1, 3, 3, 3, 3, 5, 3][seed]
    x = rand_ints(rng, (int(rng.integers(1, 3)), c, *rng.integers(k, 12, 2).tolist()), np.int8)
    w = rand_ints(rng, (c, 1, k, k), np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    n = c if seed % 2 else 1  # per-channel or one multiplier
    mult, shift = rng.integers(1, 2**15, n), rng.choice([1, 3, 9, 17], n).astype(np.int64)
    attrs = {"rounding": ["half_even", "bpu_round"][seed % 2],
             "out_dtype": ["int8", "int16"][seed // 5], "relu": seed % 3 == 0, "group": c,
             "strides": rng.integers(1, 3, 2).tolist(), "pads": rng.integers(0, 2, 4).tolist(),
             "dilations": [1 + seed % 4 // 3] * 2}  # fmt: skip
    ran = []
    real = exec_depthwise.run
    monkeypatch.setattr(exec_depthwise, "run", lambda *a: ran.append(1) or real(*a))
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    ex = Executor(_program(x, w, bias, mult, shift, attrs, plain=seed % 3 == 1))
    for _ in range(3):  # kernel, replay, frozen plan
        np.testing.assert_array_equal(ex.run({"x": x})[0]["out"], want)
    assert ran, "the compiled depthwise kernel ran"


@pytest.mark.parametrize("plain", [False, True])
def test_depthwise_with_a_fused_clip_equals_qconv_then_qclip(plain):
    """MobileNetV2's depthwise conv + ReLU6 as one CONV (attrs ``clip``): the kernel clamps
    to the clip's bounds in its epilogue."""
    rng = np.random.default_rng(11)
    c = 40
    x, w = rand_ints(rng, (2, c, 9, 9), np.int8), rand_ints(rng, (c, 1, 3, 3), np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    mult, shift = rng.integers(1, 2**15, c), np.full(c, 12)
    attrs = {"rounding": "half_even", "out_dtype": "int8", "relu": 0, "group": c,
             "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1]}  # fmt: skip
    y = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    want = CUSTOM_OPS["QClip"].evaluate([y], {"lo": 0, "hi": 47})
    assert (want != y).any() and (want == 47).any()
    ex = Executor(_program(x, w, bias, mult, shift, {**attrs, "clip": [0, 47]}, plain=plain))
    for _ in range(3):  # kernel, replay, frozen plan
        np.testing.assert_array_equal(ex.run({"x": x})[0]["out"], want)
    plans = [v for k, v in ex.consts.derived.items() if k[0] == "dw_plan"]
    assert plans and all(p is not None for p in plans)  # the compiled depthwise kernel


def test_depthwise_without_requantize_keeps_the_int64_path():
    rng = np.random.default_rng(0)
    x, w = rand_ints(rng, (1, 4, 5, 5), np.int8), rand_ints(rng, (4, 1, 3, 3), np.int8)
    empty = np.zeros(0, np.int64)
    attrs = {"rounding": "half_even", "out_dtype": "int32", "relu": 0, "group": 4,
             "pads": [1, 1, 1, 1]}  # fmt: skip
    prog = _program(x, w, empty, empty, empty, attrs)
    want = CUSTOM_OPS["QConv"].evaluate([x, w, empty, empty, empty], attrs)
    np.testing.assert_array_equal(Executor(prog).run({"x": x})[0]["out"], want)
    consts = Executor(prog).consts
    assert exec_depthwise.build(prog.instructions[1], consts, torch.int8, True) is None


def test_paired_weights_keep_even_and_odd_channels_apart():
    """VPDPWSSD's lane k sums int16 lanes 2k and 2k+1: against the even-lane weights that is
    channel 2k's product alone, against the odd-lane weights channel 2k+1's."""
    rng = np.random.default_rng(1)
    w = torch.from_numpy(rand_ints(rng, (37, 3, 3), np.int8))
    x = torch.from_numpy(rand_ints(rng, (64,), np.int8)).to(torch.int32)  # two blocks of 32
    paired = exec_depthwise.pair_weights(w)
    assert paired.shape == (3, 3, 2, 2, 32) and paired.dtype == torch.int16
    for i, j in [(0, 0), (1, 2), (2, 1)]:
        for b in range(2):
            xs = x[32 * b : 32 * b + 32]
            even, odd = ((xs * paired[i, j, b, p]).reshape(16, 2).sum(1) for p in (0, 1))
            got = torch.stack([even, odd], 1).reshape(-1)  # interleaved: channel order
            want = torch.zeros(32, dtype=torch.int32)
            real = min(37 - 32 * b, 32)
            want[:real] = xs[:real] * w[32 * b : 32 * b + real, i, j]
            assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("strides", "pads", "dil"),
    [([1, 1], [1, 1, 1, 1], 1), ([2, 2], [1, 1, 1, 1], 1), ([1, 2], [0, 2, 1, 0], 1),
     ([2, 1], [1, 0, 0, 1], 2)],
)  # fmt: skip
def test_depthwise_3x3_interior_runs_and_borders(strides, pads, dil):
    """A 3x3 conv over wide rows: each row's run of windows wholly inside the input (weights
    held in registers) and the border pixels on either side (tap by tap) agree with QConv."""
    rng = np.random.default_rng(sum(strides) + sum(pads) + dil)
    c = 64
    x = rand_ints(rng, (2, c, 9, 23), np.int8)
    w = rand_ints(rng, (c, 1, 3, 3), np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    mult, shift = rng.integers(1, 2**15, c), rng.choice([9, 17], c).astype(np.int64)
    attrs = {"rounding": "half_even", "out_dtype": "int8", "relu": 0, "group": c,
             "strides": strides, "pads": pads, "dilations": [dil, dil]}  # fmt: skip
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    ex = Executor(_program(x, w, bias, mult, shift, attrs))
    for _ in range(2):
        np.testing.assert_array_equal(ex.run({"x": x})[0]["out"], want)


def test_a_kernel_of_more_taps_than_the_avx2_pairs_equals_qconv():
    """A 9x9 depthwise kernel (81 taps: past qdw.c's DW_PAIRS on the AVX2 build, which then
    runs the general form) agrees with QConv, borders included."""
    rng = np.random.default_rng(9)
    c = 40
    x = rand_ints(rng, (1, c, 12, 11), np.int8)
    w = rand_ints(rng, (c, 1, 9, 9), np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    mult, shift = rng.integers(1, 2**15, c), rng.choice([9, 17], c).astype(np.int64)
    attrs = {"rounding": "bpu_round", "out_dtype": "int16", "relu": 0, "group": c,
             "strides": [1, 1], "pads": [4, 4, 4, 4], "dilations": [1, 1]}  # fmt: skip
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    ex = Executor(_program(x, w, bias, mult, shift, attrs))
    for _ in range(2):
        np.testing.assert_array_equal(ex.run({"x": x})[0]["out"], want)


@pytest.mark.parametrize(
    ("c", "shape", "pads", "out_dtype"),
    [(37, (2, 21, 13), [1, 1, 1, 1], "int8"), (16, (1, 9, 30), [0, 2, 1, 0], "int16"),
     (64, (1, 17, 5), [2, 0, 0, 2], "int8"), (8, (1, 4, 330), [1, 1, 1, 1], "int8")],
)  # fmt: skip
def test_depthwise_3x3_bands_of_widened_rows(c, shape, pads, out_dtype):
    """qdw.c's widened form (3x3, stride 1: tasks of DW_BAND output rows whose input rows are
    widened once into a ring, zero rows and columns for the padding): bands that end inside
    the map, asymmetric pads, a last block of 5 channels, two images, int16 outputs; and a row
    wider than DW_COLS (the row-at-a-time form) agree with QConv."""
    rng = np.random.default_rng(c + shape[1])
    x = rand_ints(rng, (shape[0], c, *shape[1:]), np.int8)
    w = rand_ints(rng, (c, 1, 3, 3), np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    mult, shift = rng.integers(1, 2**15, c), rng.choice([9, 17], c).astype(np.int64)
    attrs = {"rounding": "half_even", "out_dtype": out_dtype, "relu": 0, "group": c,
             "strides": [1, 1], "pads": pads, "dilations": [1, 1]}  # fmt: skip
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    ex = Executor(_program(x, w, bias, mult, shift, attrs))
    for _ in range(2):
        np.testing.assert_array_equal(ex.run({"x": x})[0]["out"], want)
