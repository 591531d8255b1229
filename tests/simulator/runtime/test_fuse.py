"""simulator.runtime.fuse: the input's quantize, ToNHWC and the stem's pad as one call gives
the bytes the three calls give, and only chains whose buffers are theirs alone are joined."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.program.isa import Instruction, Layout, Op, Program
from simulator.runtime import fuse, native
from simulator.runtime.executor import Executor

pytestmark = pytest.mark.skipif(native.library() is None, reason="no compiled kernels here")


def _three_calls(x, scale, half_even, pads) -> tuple[int, np.ndarray]:
    """qp_quantize -> qp_to_nhwc (16 channels) -> qp_pad (row runs) as the plan calls them:
    (return value of the quantize, padded bytes)."""
    lib = native.library()
    n, c, h, w = x.shape
    pt, pb, pl, pr = pads
    q = np.empty(x.shape, np.int8)
    per = scale.size > 1
    rc = lib.qp_quantize(x.ctypes.data, 0, n if per else 1, c if per else 1,
                         h * w if per else x.size, scale.ctypes.data, half_even, -128.0, 127.0,
                         q.ctypes.data, 0)  # fmt: skip
    nhwc = np.empty((n, h, w, 16), np.int8)
    lib.qp_to_nhwc(q.ctypes.data, 0, n, c, h * w, 16, nhwc.ctypes.data)
    xs = np.empty((n, h + pt + pb, w + pl + pr, c), np.uint8)
    lib.qp_pad(nhwc.ctypes.data, 0, n, h, w, 16, c, pt, pb, pl, pr, c, xs.ctypes.data)
    return rc, xs


def _joined(x, scale, half_even, pads) -> tuple[int, np.ndarray]:
    lib = native.library()
    n, c, h, w = x.shape
    pt, pb, pl, pr = pads
    xs = np.full((n, h + pt + pb, w + pl + pr, c), 0x5A, np.uint8)  # garbage: all is written
    rc = lib.qp_quantize_pad(x.ctypes.data, n, c, h, w, scale.ctypes.data, int(scale.size > 1),
                             half_even, -128.0, 127.0, pt, pb, pl, pr, lib.qp_pad_offset(),
                             xs.ctypes.data)  # fmt: skip
    return rc, xs


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 5), w=st.integers(1, 40),
       pads=st.tuples(*[st.integers(0, 3)] * 4), per_channel=st.booleans(),
       half_even=st.integers(0, 1), seed=st.integers(0, 2**16))  # fmt: skip
def test_the_joined_call_writes_what_the_three_calls_write(n, c, h, w, pads, per_channel,
                                                             half_even, seed):  # fmt: skip
    """Against the three kernels the plan would call: values on the rounding ties (k + 0.5
    times the scale) and far outside int8, per-tensor and per-channel scales, widths that
    are not a multiple of 16, pads of 0 to 3 on each side."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.01, 0.2, c if per_channel else 1)
    s = scale.astype(np.float32).reshape(-1, 1, 1) if per_channel else np.float32(scale[0])
    ties = (rng.integers(-140, 140, (n, c, h, w)) + 0.5).astype(np.float32) * s
    x = np.where(rng.random((n, c, h, w)) < 0.5, ties, rng.normal(0, 40, (n, c, h, w)) * s)
    x = np.ascontiguousarray(x, np.float32)
    want_rc, want = _three_calls(x, scale, half_even, pads)
    got_rc, got = _joined(x, scale, half_even, pads)
    assert got_rc == want_rc == 0
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_value_that_is_not_finite_is_reported_as_the_quantize_reports_it(bad):
    x = np.ones((1, 3, 4, 20), np.float32)
    x[0, 2, 3, 19] = bad  # the last value of the last row: a tail lane of the last channel
    scale = np.array([0.1])
    assert _three_calls(x, scale, 1, (1, 1, 1, 1))[0] == 1
    assert _joined(x, scale, 1, (1, 1, 1, 1))[0] == 1


def _stem_program(scale, c: int = 3, o: int = 5) -> Program:
    """QUANTIZE -> ToNHWC (16) -> a 3x3 stride-2 conv of ``c`` real channels -> ToNCHW."""
    rng = np.random.default_rng(2)
    w = rng.integers(-128, 128, (o, c, 3, 3)).astype(np.int8)
    packed = np.zeros((16, 3, 3, 16), np.int8)
    packed[:o, :, :, :c] = w.transpose(0, 2, 3, 1)
    consts = {"w": packed, "b": np.pad(rng.integers(-999, 999, o), (0, 16 - o)),
              "m": np.pad(rng.integers(1, 2**15, o), (0, 16 - o)),
              "s": np.pad(rng.integers(8, 14, o), (0, 16 - o))}  # fmt: skip
    conv = {"rounding": "half_even", "out_dtype": "int8", "relu": 0, "strides": [2, 2],
            "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1, "layout": "nhwc"}  # fmt: skip
    quant = {"scale": scale, "dtype": "int8", "rounding": "bpu_round"}
    instrs = [
        Instruction(Op.QUANTIZE, ("x",), ("q",), (), quant, ("quant",)),
        Instruction(Op.LAYOUT, ("q",), ("qn",), (), {"op_type": "ToNHWC", "channels_padded": 16}),
        Instruction(Op.CONV, ("qn",), ("y",), ("w", "b", "m", "s"), conv, ("conv",)),
        Instruction(Op.LAYOUT, ("y",), ("out",), (), {"op_type": "ToNCHW", "channels": o}),
    ]
    layouts = {"qn": Layout("nhwc", c, 16), "y": Layout("nhwc", o, 16)}
    return Program("nash-e", {"x": {"shape": [2, c, 9, 21], "dtype": "float32"}}, {"out": {}},
                   instrs, consts, layouts)  # fmt: skip


@pytest.mark.parametrize("scale", [0.07, [0.05, 0.09, 0.11]], ids=["one-scale", "per-channel"])
def test_a_frozen_plan_joins_an_rgb_stem_and_gives_the_kernels_outputs(scale):
    prog = _stem_program(scale)
    rng = np.random.default_rng(4)
    xs = [rng.normal(0, 4, (2, 3, 9, 21)).astype(np.float32) for _ in range(8)]
    ex = Executor(prog, timings=True)
    for x in xs:
        got = ex.run({"x": x})[0]["out"]
        np.testing.assert_array_equal(got, Executor(prog).run({"x": x})[0]["out"])
    assert ex.last_path == "frozen plan"
    assert [c[2].__name__ for c in ex._frozen.calls][0] == "qp_quantize_pad"
    assert 1 not in {i for i, _, _ in ex.timings}  # the layout's work is the quantize's
    bad = xs[0].copy()
    bad[1, 2, 8, 20] = np.inf  # the joined call reports it: the kernels run instead
    np.testing.assert_array_equal(ex.run({"x": bad})[0]["out"],
                                  Executor(prog).run({"x": bad})[0]["out"])  # fmt: skip


class _Fn:
    def __init__(self, name: str):
        self.__name__ = name


def _chain_calls(quant_out=(1, 0), nhwc_in=(1, 0), f64=0):
    """A quantize -> ToNHWC -> pad chain as freeze() lists it, with its uses: buffer 1
    between the first two, 2 between the last two, the input a fill, 3 the pad's output."""
    q = [0, f64, 1, 1, 3 * 8 * 8, 111, 1, -128.0, 127.0, 0, 0]
    t = [0, 0, 1, 3, 64, 16, 0]
    p = [0, 0, 1, 8, 8, 16, 3, 1, 1, 1, 1, 3, 0]
    plan = [(0, Op.QUANTIZE, _Fn("qp_quantize"), q, ((0, 0, 0),), 0),
            (1, Op.LAYOUT, _Fn("qp_to_nhwc"), t, (), None),
            (2, Op.CONV, _Fn("qp_pad"), p, (), None)]  # fmt: skip
    uses = [[(9, *quant_out)], [(0, *nhwc_in), (6, 2, 0)], [(0, 2, 0), (12, 3, 64)]]
    return plan, uses


def test_join_rewrites_a_chain_whose_buffers_are_its_own():
    plan, uses = _chain_calls()
    joined, joined_uses = fuse.join(plan, uses, own=set())
    assert len(joined) == 1 and joined[0][2].__name__ == "qp_quantize_pad"
    assert joined[0][4] == ((0, 0, 0),) and joined_uses == [[(15, 3, 64)]]
    args = joined[0][3]
    assert args[1:5] == [1, 3, 8, 8] and args[6] == 0 and args[10:14] == [1, 1, 1, 1]


@pytest.mark.parametrize("case", ["used elsewhere", "an output", "offset", "other buffer",
                                  "float64", "wide"])  # fmt: skip
def test_join_leaves_chains_it_cannot_prove(case):
    plan, uses = _chain_calls(
        quant_out=(1, 64) if case == "offset" else (1, 0),
        nhwc_in={"offset": (1, 64), "other buffer": (4, 0)}.get(case, (1, 0)),
        f64=int(case == "float64"),
    )
    if case == "used elsewhere":
        plan.append((3, Op.CLIP, _Fn("qp_clip"), [0, 0, 64, 0, 1, 0], (), None))
        uses.append([(0, 1, 0), (5, 5, 0)])
    if case == "wide":
        plan[1][3][1] = 1
    joined, _ = fuse.join(plan, uses, own={2} if case == "an output" else set())
    assert [c[2].__name__ for c in joined][:3] == list(fuse.CHAIN)
