"""The vectorized executor against the reference evaluators (CUSTOM_OPS): same integers."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith import intmath
from simulator.arith.composite import build_layernorm, build_softmax
from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.arith.lut import build_direct_table, build_segmented_table
from simulator.kernels import exec_kernels as ek
from simulator.program.isa import Instruction, Layout, Op, Program
from simulator.runtime import native
from simulator.runtime.executor import KERNELS, Executor
from tests.simulator.arith.test_kernels import rand_ints

MODES = fp.ROUNDING_MODES
EMPTY = np.zeros(0, np.int64)


def program(op: Op, data, consts, attrs, n_out: int = 1) -> Program:
    """One instruction over inputs x0.. and constants c0.. ("" for an absent one)."""
    names = [f"c{i}" if c is not None else "" for i, c in enumerate(consts)]
    instr = Instruction(op, tuple(f"x{i}" for i in range(len(data))),
                        tuple(f"y{i}" for i in range(n_out)), tuple(names), attrs, ("L0",))  # fmt: skip
    return Program(
        "nash-e",
        {f"x{i}": {"shape": list(x.shape), "dtype": str(x.dtype)} for i, x in enumerate(data)},
        {f"y{i}": {} for i in range(n_out)},
        [instr],
        {n: c for n, c in zip(names, consts, strict=True) if n},
    )


def execute(op: Op, data, consts, attrs, n_out: int = 1) -> list[np.ndarray]:
    """The outputs of one instruction on ``data``. The executor also runs it on the data's
    values reversed (same geometry, other values) and then both again twice: from its
    replay (simulator.runtime.replay) where the instruction has one, then from the frozen plan
    (simulator.runtime.frozen) where the program has one; they must repeat the kernel's results
    exactly."""
    ex = Executor(program(op, data, consts, attrs, n_out))
    feeds = [{f"x{i}": x for i, x in enumerate(xs)} for xs in (data, [_reversed(x) for x in data])]
    first = [ex.run(f) for f in feeds]
    for f, (outs, caps) in [*zip(feeds, first, strict=True)] * 2:
        again, _ = ex.run(f)
        assert caps == {} and again.keys() == outs.keys()
        for name, y in outs.items():
            assert again[name].dtype == y.dtype
            np.testing.assert_array_equal(again[name], y)
    return [first[0][0][f"y{i}"] for i in range(n_out)]


def _reversed(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1)[::-1].reshape(x.shape).copy()


def check(op: Op, ref_op: str, data, consts, attrs) -> np.ndarray:
    """Executor output == CUSTOM_OPS[ref_op] on the same operands, values and dtype."""
    (got,) = execute(op, data, consts, attrs)
    want = CUSTOM_OPS[ref_op].evaluate([*data, *(EMPTY if c is None else c for c in consts)], attrs)
    if want.dtype == np.int64:  # table ops: the reference returns int64, we store out_dtype
        assert got.dtype in (np.int8, np.int16, np.int32)
        want = want.astype(got.dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    return got


def req_consts(rng, c: int, per_channel: bool, out_dtype: str):
    """(mult, shift): small shifts make exact ties frequent; empty for int32 half the time."""
    if out_dtype == "int32" and rng.random() < 0.5:
        return EMPTY, EMPTY
    n = c if per_channel else 1
    shift = rng.choice([0, 1, 2, 3, 9, 17], size=n)
    return rng.integers(1, 2**15, n), shift.astype(np.int64)


def qattrs(rng, **kw) -> dict:
    return {"rounding": str(rng.choice(MODES)), "out_dtype": str(rng.choice(["int8", "int16",
            "int32"])), "relu": int(rng.integers(0, 2)), **kw}  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_conv(seed):
    rng = np.random.default_rng(seed)
    group = [1, 1, 2, 4][seed % 4]
    cg, og, k = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.choice([1, 2, 3]))
    one_d = seed % 6 == 5
    spatial = (int(rng.integers(k, 9)),) if one_d else tuple(rng.integers(k, 9, 2).tolist())
    nd = len(spatial)
    x = rand_ints(rng, (int(rng.integers(1, 3)), cg * group, *spatial),
                  np.int16 if seed % 5 == 4 else np.int8)  # fmt: skip
    w = rand_ints(rng, (og * group, cg, *([k] * nd)), np.int8)
    attrs = qattrs(rng, group=group, strides=rng.integers(1, 3, nd).tolist(),
                   pads=rng.integers(0, 2, 2 * nd).tolist(),
                   dilations=rng.integers(1, 2 if k > 2 else 3, nd).tolist())  # fmt: skip
    bias = rng.integers(-5000, 5000, og * group).astype(np.int32) if seed % 3 else EMPTY
    mult, shift = req_consts(rng, og * group, seed % 2 == 0, attrs["out_dtype"])
    check(Op.CONV, "QConv", [x], [w, bias, mult, shift], attrs)


@pytest.mark.parametrize("seed", range(6))
def test_linear_and_matmul(seed):
    rng = np.random.default_rng(seed)
    b, m, k, n = 2, int(rng.integers(1, 40)), int(rng.integers(1, 70)), int(rng.integers(1, 20))
    x = rand_ints(rng, (b, m, k), np.int16 if seed == 5 else np.int8)
    w = rand_ints(rng, (n, k), np.int8)
    attrs = qattrs(rng)
    bias = rng.integers(-9999, 9999, n).astype(np.int32)
    mult, shift = req_consts(rng, n, seed % 2 == 0, attrs["out_dtype"])
    check(Op.LINEAR, "QLinear", [x], [w, bias, mult, shift], attrs)
    mult, shift = req_consts(rng, 1, False, attrs["out_dtype"])
    y = rand_ints(rng, (b, k, n), np.int8)
    check(Op.MATMUL, "QMatMul", [x, y], [mult, shift], attrs)  # batched, both data
    check(Op.MATMUL, "QMatMul", [x], [y[0], mult, shift], attrs)  # constant right operand


@pytest.mark.parametrize("seed", range(6))
def test_eltwise(seed):
    rng = np.random.default_rng(seed)
    shape = (2, 3, 4, 5)
    a, b = rand_ints(rng, shape, np.int8), rand_ints(rng, shape, np.int16 if seed % 2 else np.int8)
    ma = rng.integers(-(2**14), 2**14, (3, 1, 1)) if seed % 3 else np.array([37])
    attrs = qattrs(rng)
    shift = np.array([int(rng.choice([0, 1, 4, 15]))])
    check(Op.ADD, "QAdd", [a, b], [ma, rng.integers(1, 2**14, (1,)), shift], attrs)
    mult, shift = req_consts(rng, 1, False, attrs["out_dtype"])
    check(Op.MUL, "QMul", [a, b], [mult, shift], attrs)
    acc = rng.integers(-(2**31), 2**31, shape).astype(np.int32)
    for axis, per in [(1, True), (-1, False), (3, True)]:
        mult, shift = req_consts(rng, shape[axis], per, attrs["out_dtype"])
        check(Op.REQUANT, "QRequant", [acc], [mult, shift], {**attrs, "axis": axis})
    check(Op.CLIP, "QClip", [b], [], {"lo": int(rng.integers(-200, 1)), "hi": 300})


@pytest.mark.parametrize("seed", range(6))
def test_pool_and_reduce(seed):
    rng = np.random.default_rng(seed)
    x = rand_ints(rng, (2, 3, int(rng.integers(3, 9)), int(rng.integers(3, 9))), np.int8)
    kern = rng.integers(1, 4, 2).tolist()
    geo = {"kernel_shape": kern, "strides": rng.integers(1, 3, 2).tolist(),
           "pads": [int(rng.integers(0, k)) for k in kern * 2]}  # fmt: skip
    check(Op.MAXPOOL, "QMaxPool", [x], [], {**geo, "dilations": [1, int(rng.integers(1, 3))]})
    attrs = qattrs(rng, count_include_pad=seed % 2, out_dtype="int8", **geo)
    m, s = np.array([int(rng.integers(1, 2**15))]), np.array([int(rng.integers(0, 12))])
    check(Op.AVGPOOL, "QAvgPool", [x], [m, s], attrs)
    for axes, keep in [([2, 3], 1), ([-1], 0), (None, 0)]:
        red = qattrs(rng, axes=axes, keepdims=keep)
        check(Op.REDUCE_MEAN, "QReduceMean", [x], [m, s], red)
        check(Op.REDUCE_SUM, "QReduceSum", [x], [m, s], red)
    check(Op.MAXPOOL, "QMaxPool", [x[:, 0]], [], {"kernel_shape": [2], "strides": [2]})


def _encoded(op: str, obj, **kw):
    attrs, inits = CUSTOM_OPS[op].encode(obj, **kw)
    return attrs, list(inits.values())


@pytest.mark.parametrize("mode", MODES)
def test_tables(mode):
    rng = np.random.default_rng(0)
    direct = build_direct_table("sigmoid", torch.sigmoid(torch.arange(-128, 128) * 0.05),
                                0.05, 1 / 255, "int8", mode)  # fmt: skip
    x8 = rand_ints(rng, (2, 3, 4, 4), np.int8)
    attrs, inits = _encoded("Lut", direct)
    check(Op.LUT, "Lut", [x8], inits, attrs)
    seg = build_segmented_table("tanh", np.tanh, 2e-4, 2**-15, "int16", mode, segments=6)
    x16 = rand_ints(rng, (3, 50), np.int16)
    attrs, inits = _encoded("Lut", seg)
    check(Op.LUT, "Lut", [x16], inits, attrs)
    attrs, inits = _encoded("Softmax", build_softmax(1e-3, "int16", 1 / 255, "int8", mode, 50),
                            axis=-1)  # fmt: skip
    check(Op.SOFTMAX, "Softmax", [x16], inits, attrs)
    ln = build_layernorm(0.02, "int8", 0.05, "int8", mode, 50, 1e-5, rng.uniform(0.5, 2, 50),
                         rng.normal(0, 0.3, 50))  # fmt: skip
    attrs, inits = _encoded("LayerNorm", ln)
    check(Op.LAYERNORM, "LayerNorm", [rand_ints(rng, (3, 50), np.int8)], inits, attrs)


@pytest.mark.parametrize("mode", MODES)
def test_quantize_dequantize(mode):
    x = (np.arange(-300, 300, dtype=np.float32) * 0.03125).reshape(2, 3, 100)  # many ties
    attrs, (scale,) = _encoded("QuantizeLinear", 0.0625, dtype="int8", rounding=mode)
    check(Op.QUANTIZE, "QuantizeLinear", [x], [scale], attrs)
    attrs, (scale,) = _encoded("QuantizeLinear", [0.1, 0.2, 0.05], axis=1, rounding=mode)
    q = check(Op.QUANTIZE, "QuantizeLinear", [x], [scale], attrs)
    (got,) = execute(Op.QUANTIZE, [x], [], {"scale": 0.0625, "dtype": "int16", "rounding": mode})
    assert got.dtype == np.int16
    (deq,) = execute(Op.DEQUANTIZE, [q], [], {"scale": [0.1, 0.2, 0.05], "axis": 1})
    want = q.astype(np.float32) * np.float32([0.1, 0.2, 0.05])[:, None]
    assert deq.dtype == np.float32 and np.array_equal(deq, want)


LAYOUT_CASES = [
    ("Reshape", [np.array([0, -1, 2])], {}),
    ("Transpose", [], {"perm": [2, 0, 1]}),
    ("Flatten", [], {"axis": 2}),
    ("Unsqueeze", [np.array([0, -1])], {}),
    ("Slice", [np.array([1, -1]), np.array([100, -5]), np.array([1, 2]), np.array([1, -2])], {}),
    ("Slice", [np.array([0]), np.array([2**63 - 1]), np.array([-1])], {}),  # whole axis
    ("Slice", [np.array([-2, 5]), np.array([-100, 1]), np.array([2, 0]), np.array([3, 1])], {}),
    ("Gather", [np.array([[2, -1], [0, 0]])], {"axis": 1}),
    ("Split", [np.array([1, 3])], {"axis": 1}),
    ("Pad", [np.array([0, 1, 1, 0, 2, 1]), np.array(-3, np.int8)], {"mode": "constant"}),
    ("Pad", [np.array([0, 2, 1, 0, 1, 3])], {"mode": "reflect"}),
    ("Pad", [np.array([1, 0, 2, 0, 3, 0])], {"mode": "edge"}),
    ("Pad", [np.array([0, 2, 1, 0, 1, 3])], {"mode": "wrap"}),  # conv padding_mode="circular"
    ("Expand", [np.array([3, 1, 1, 6])], {}),
    ("Identity", [], {}),
]


@pytest.mark.parametrize("op_type,consts,attrs", LAYOUT_CASES)
def test_layout_matches_onnx(op_type, consts, attrs):
    x = rand_ints(np.random.default_rng(1), (2, 4, 6), np.int8)
    n_out = 2 if op_type == "Split" else 1
    got = execute(Op.LAYOUT, [x], consts, {"op_type": op_type, **attrs}, n_out)
    names = [f"c{i}" for i in range(len(consts))]
    node = helper.make_node(op_type, ["x", *names], [f"y{i}" for i in range(n_out)], **attrs)
    inits = [numpy_helper.from_array(c, n) for c, n in zip(consts, names, strict=True)]
    outs = [helper.make_tensor_value_info(f"y{i}", 3, None) for i in range(n_out)]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", 3, None)], outs, inits
    )
    want = ReferenceEvaluator(helper.make_model(graph)).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_expand_to_a_shape_computed_at_run_time():
    """A LAYOUT Expand whose target is a buffer (a batch read by Shape) equals ONNX's."""
    x = rand_ints(np.random.default_rng(1), (1, 4, 1), np.int8)
    shape = np.array([3, 1, 6])
    (got,) = execute(Op.LAYOUT, [x, shape], [], {"op_type": "Expand"})
    np.testing.assert_array_equal(got, np.broadcast_to(x, (3, 4, 6)))


def _pad_to(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return np.pad(a, widths)


@pytest.mark.parametrize("mode", MODES)
def test_nhwc_padded_matches_plain(mode):
    """ToNHWC -> conv/add/clip/maxpool/avgpool/lut in nhwc (channels padded) -> ToNCHW."""
    rng = np.random.default_rng(3)
    c, o, cp, op_ = 5, 6, 16, 16
    x = rand_ints(rng, (2, c, 7, 6), np.int8)
    w, bias = rand_ints(rng, (o, c, 3, 3), np.int8), rng.integers(-999, 999, o)
    mult, shift = rng.integers(1, 2**15, o), rng.integers(4, 12, o)
    conv = {"rounding": mode, "out_dtype": "int8", "relu": 0, "strides": [2, 1],
            "pads": [1, 0, 1, 1], "dilations": [1, 1], "group": 1}  # fmt: skip
    y = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], conv)
    ma, mb, sh = rng.integers(1, 2**10, (o, 1, 1)), rng.integers(-(2**10), 2**10, (o, 1, 1)), 9
    z = CUSTOM_OPS["QAdd"].evaluate([y, y[:, ::-1], ma, mb, np.array([sh])], conv)
    clip = {"lo": 3, "hi": 50}
    pool = {"kernel_shape": [2, 2], "strides": [1, 2], "pads": [0, 1, 1, 0]}
    z2 = CUSTOM_OPS["QClip"].evaluate([CUSTOM_OPS["QMaxPool"].evaluate([z], pool)], clip)
    lut = build_direct_table("exp", np.exp(np.arange(-128, 128) * 0.02), 0.02, 0.05, "int8", mode)
    lut_attrs, lut_inits = _encoded("Lut", lut)
    want = CUSTOM_OPS["Lut"].evaluate([z2, *lut_inits], lut_attrs).astype(np.int8)
    nhwc = {"layout": "nhwc"}
    w_packed = _pad_to(_pad_to(w.transpose(0, 2, 3, 1), 0, op_), 3, cp)
    consts = {"w": w_packed, "b": _pad_to(bias, 0, op_), "m": _pad_to(mult, 0, op_),
              "s": _pad_to(shift, 0, op_), "ma": _pad_to(ma.reshape(-1), 0, op_),
              "mb": _pad_to(mb.reshape(-1), 0, op_), "sh": np.array([sh])}  # fmt: skip
    consts.update({f"t{i}": a for i, a in enumerate(lut_inits)})
    instrs = [
        Instruction(Op.LAYOUT, ("x",), ("xn",), (), {"op_type": "ToNHWC", "channels_padded": cp}),
        Instruction(Op.CONV, ("xn",), ("y",), ("w", "b", "m", "s"), {**conv, **nhwc}, ("conv",)),
        Instruction(Op.LAYOUT, ("y",), ("yr",), (), {"op_type": "Slice"}),  # replaced below
        Instruction(Op.ADD, ("y", "yr"), ("z",), ("ma", "mb", "sh"), {**conv, **nhwc}, ("add",)),
        Instruction(Op.MAXPOOL, ("z",), ("p",), (), {**pool, **nhwc}),
        Instruction(Op.CLIP, ("p",), ("q",), (), {**clip, **nhwc}),
        Instruction(Op.LUT, ("q",), ("r",), ("t0", "t1", "t2", "t3"), {**lut_attrs, **nhwc}),
        Instruction(Op.LAYOUT, ("r",), ("out",), (), {"op_type": "ToNCHW", "channels": o}),
    ]
    # y[:, ::-1] on the real channels, as a plain round trip: NCHW, flip, back to padded NHWC
    idx = np.concatenate([np.arange(o)[::-1], np.arange(o, op_)])
    instrs[2] = Instruction(Op.LAYOUT, ("y",), ("yr",), ("idx",), {"op_type": "Gather", "axis": 3})
    consts["idx"] = idx
    layouts = {b: Layout("nhwc", o, op_) for b in ("y", "yr", "z", "p", "q", "r")}
    prog = Program("nash-e", {"x": {"shape": list(x.shape), "dtype": "int8"}}, {"out": {}},
                   instrs, consts, layouts, {"conv": "y", "add": "z", "lut": "r"})  # fmt: skip
    outs, caps = Executor(prog).run({"x": x}, capture=True)
    np.testing.assert_array_equal(outs["out"], want)
    np.testing.assert_array_equal(caps["conv"], y)
    np.testing.assert_array_equal(caps["add"], z)
    assert caps["lut"].shape == want.shape


def test_capture_on_and_off_and_timings():
    rng = np.random.default_rng(5)
    x = rand_ints(rng, (1, 2, 4, 4), np.int8)
    instrs = [
        Instruction(Op.CLIP, ("x",), ("a",), (), {"lo": 0, "hi": 127}, ("relu",)),
        Instruction(Op.LAYOUT, ("a",), ("b",), ("shape",), {"op_type": "Reshape"}, ("flat",)),
        Instruction(Op.DEQUANTIZE, ("b",), ("out",), (), {"scale": [0.5]}, ("dq",)),
    ]
    prog = Program("nash-e", {"x": {"shape": [1, 2, 4, 4], "dtype": "int8"}}, {"out": {}},
                   instrs, {"shape": np.array([1, -1])}, captures={"relu": "a", "flat": "b"})  # fmt: skip
    ex = Executor(prog, timings=True)
    outs, caps = ex.run({"x": x}, capture=True)
    np.testing.assert_array_equal(caps["relu"], np.maximum(x, 0))
    assert caps["flat"].shape == (1, 32)
    np.testing.assert_array_equal(outs["out"], np.maximum(x, 0).reshape(1, -1) * np.float32(0.5))
    assert [t[1] for t in ex.timings] == [Op.CLIP, Op.LAYOUT, Op.DEQUANTIZE]
    assert set(ex.timings_by_op()) == {"clip", "layout", "dequantize"}
    outs2, caps2 = Executor(prog).run({"x": x})
    assert caps2 == {} and Executor(prog).timings is None
    np.testing.assert_array_equal(outs2["out"], outs["out"])


def test_requant_ties_and_limits_match_fixedpoint():
    v = np.array([-(2**31), -7, -6, -5, -3, -2, -1, 0, 1, 2, 3, 5, 6, 7, 2**31 - 1], np.int64)
    for mode in MODES:
        for m, s in [(1, 0), (1, 1), (3, 1), (1, 2), (5, 3), (2**31 - 1, 30), (1, 62)]:
            want = intmath.requantize(v, m, s, "int32", mode)
            got = ek.requant(torch.from_numpy(v), torch.tensor([m]), torch.tensor([s]),
                             "int32", mode, None)  # fmt: skip
            np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(SimulatorError, match="2\\*\\*62"):
        ek.requant(torch.tensor([2**40]), torch.tensor([2**22]), torch.tensor([3]), "int8",
                   "half_even", None)  # fmt: skip
    with pytest.raises(SimulatorError, match="shift"):
        ek.requant(torch.tensor([1]), torch.tensor([1]), torch.tensor([63]), "int8",
                   "half_even", None)  # fmt: skip


def test_errors_name_the_instruction(monkeypatch):
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(SimulatorError, match="CPU op 'NoSuchOp' failed"):
        execute(Op.CPU, [x], [], {"op_type": "NoSuchOp"})
    (y,) = execute(Op.CPU, [x, x + 1], [], {"op_type": "Add"})
    assert y.dtype == np.float32 and np.all(y == 1)
    rgb = np.random.default_rng(0).integers(0, 256, (1, 4, 6, 3), dtype=np.uint8)
    attrs = {"runtime_format": "rgb", "training_format": "bgr"}
    (y,) = execute(Op.PREPROCESS, [rgb], [], attrs)
    np.testing.assert_array_equal(y, rgb[..., ::-1].astype(np.int16) - 128)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SimulatorError, match="PREPROCESS needs simulator.arith.board_input"):
        execute(Op.PREPROCESS, [rgb], [], attrs)
    bad = Program("nash-e", {}, {"y": {}}, [Instruction(Op.CLIP, ("nope",), ("y",))], {})
    with pytest.raises(SimulatorError, match="undefined buffers"):
        Executor(bad)
    with pytest.raises(SimulatorError, match="instruction 0 \\(conv"):
        execute(Op.CONV, [np.zeros((1, 2, 3, 3), np.int8)], [np.zeros((1, 3, 1, 1), np.int8),
                EMPTY, EMPTY, EMPTY], {"out_dtype": "int32", "rounding": "half_even"})  # fmt: skip
    assert set(KERNELS) == set(Op)


@pytest.mark.parametrize("mode", MODES)
def test_round_shift_equals_round_div(mode):
    """Per-channel shifts 0..62, |v| up to 2**62 - 1, exact ties at every shift <= 50."""
    rng = np.random.default_rng(7)
    s = rng.integers(0, 63, 9)
    v = rng.integers(-(2**62) + 1, 2**62, (40, 9), dtype=np.int64)
    v[20:] //= 2 ** rng.integers(0, 60, (20, 9))
    small = np.minimum(s, 50)
    tie = (rng.integers(-999, 999, (10, 9)) << small) + np.where(small > 0, 1 << small >> 1, 0)
    v[:10] = np.where(s <= 50, tie, v[:10])
    v[10:13] = np.array([-(2**62) + 1, 2**62 - 1, 0])[:, None]
    got = ek.round_shift(torch.from_numpy(v), torch.from_numpy(s), mode)
    np.testing.assert_array_equal(got.numpy(), intmath.round_div(v, np.int64(1) << s, mode))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32])
@pytest.mark.parametrize(
    "c,padded", [(1, 16), (3, 4), (5, 32), (16, 16), (3, 48), (3, 16), (4, 16)]
)
def test_to_nhwc_pads_channels_with_zeros(dtype, c, padded):
    """ToNHWC (compiled for narrow int8/int16 inputs, torch otherwise) equals a permute
    and a zero pad of the channel axis."""
    from simulator.kernels.exec_layout import LAYOUT_OPS

    x = torch.randint(-300, 300, (3, c, 5, 7)).clamp(-128, 127).to(dtype)
    (got,) = LAYOUT_OPS["ToNHWC"]([x], [], {"channels_padded": padded}, 1)
    want = torch.nn.functional.pad(x.permute(0, 2, 3, 1), (0, padded - c))
    assert got.dtype == dtype and torch.equal(got, want)


def test_view_layouts_replay_per_input_geometry():
    """A view-only LAYOUT chain is replayed from its first run's views; another batch size
    is computed afresh."""
    instrs = [
        Instruction(Op.LAYOUT, ("x",), ("t",), (), {"op_type": "Transpose", "perm": [0, 2, 1]}),
        Instruction(Op.LAYOUT, ("t",), ("r",), ("shape",), {"op_type": "Reshape"}),
        Instruction(Op.LAYOUT, ("r",), ("s", "u"), ("split",), {"op_type": "Split", "axis": 1}),
        Instruction(Op.LAYOUT, ("u",), ("out",), ("axes",), {"op_type": "Unsqueeze"}),
    ]
    consts = {"shape": np.array([0, -1]), "split": np.array([5, 7]), "axes": np.array([1])}
    prog = Program("nash-e", {"x": {"dtype": "int8"}}, {"out": {}, "s": {}}, instrs, consts)
    ex = Executor(prog)
    for n in (2, 2, 3, 2):
        x = rand_ints(np.random.default_rng(n), (n, 4, 3), np.int8)
        outs, _ = ex.run({"x": x})
        flat = x.transpose(0, 2, 1).reshape(n, -1)
        np.testing.assert_array_equal(outs["s"], flat[:, :5])
        np.testing.assert_array_equal(outs["out"], flat[:, None, 5:])
    assert {0, 2, 3} <= {i for i in range(4) if i in ex.replays}  # views
    # the Reshape of a transposed buffer copies: a replayed compiled copy when it builds
    assert (1 in ex.replays) == (native.library() is not None)


@pytest.mark.parametrize("shape", [(1,), (3, 4)])
def test_inputs_with_negative_strides_are_copied(shape):
    """A reversed numpy view (torch cannot wrap negative strides) is taken as its values."""
    x = rand_ints(np.random.default_rng(3), shape, np.int8)
    prog = program(Op.LAYOUT, [x], [], {"op_type": "Identity"})
    got = Executor(prog).run({"x0": x[::-1]})[0]["y0"]
    np.testing.assert_array_equal(got, x[::-1])
