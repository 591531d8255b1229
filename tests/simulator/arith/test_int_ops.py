"""Integer ONNX ops against slow per-element references (Python ints, Fractions)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.custom_ops import CUSTOM_OPS, DOMAIN
from simulator.arith.int_ops import INT_OPS
from tests.simulator.arith.test_fixedpoint import ref_requantize, ref_round
from tests.simulator.arith.test_kernels import rand_ints, ref_conv, ref_pool

MODES = fp.ROUNDING_MODES
OUT = ["int8", "int16", "int32"]
EMPTY = np.zeros(0, np.int64)


def run(op: str, *inputs, **attrs) -> np.ndarray:
    return CUSTOM_OPS[op].evaluate(list(inputs), attrs)


def ref_req(acc, m, s, dtype, mode, relu=0) -> np.ndarray:
    """ref_requantize per element after numpy broadcasting of acc, m, s (object ints)."""
    acc, m, s = np.broadcast_arrays(np.asarray(acc, object), np.asarray(m), np.asarray(s))
    out = [
        ref_requantize(int(a), int(mm), int(ss), dtype, mode)
        for a, mm, ss in zip(acc.ravel(), m.ravel(), s.ravel(), strict=True)
    ]
    out = np.array(out, dtype=np.int64).reshape(acc.shape)
    return np.maximum(out, 0) if relu else out


def ref_div(total, n, m, s, dtype, mode) -> np.ndarray:
    """clamp(round(total * m / (n * 2**s))) per element, exact rationals."""
    qmin, qmax = fp.qrange(dtype)
    total, n = np.broadcast_arrays(np.asarray(total, object), np.asarray(n, object))
    out = [
        min(max(ref_round(Fraction(int(t) * m, int(c) * 2**s), mode), qmin), qmax)
        for t, c in zip(total.ravel(), n.ravel(), strict=True)
    ]
    return np.array(out, dtype=np.int64).reshape(total.shape)


def check(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", ["int8", "int16"])
@pytest.mark.parametrize("group,relu", [(1, 0), (2, 1), (4, 0)])
def test_qconv(mode, out_dtype, group, relu):
    rng = np.random.default_rng(group)
    x, w = rand_ints(rng, (2, 4, 5, 5), np.int8), rand_ints(rng, (4, 4 // group, 3, 3), np.int8)
    bias = rng.integers(-5000, 5000, 4).astype(np.int32)
    mult, shift = rng.integers(2**14, 2**15, 4), rng.integers(13, 17, 4)
    geo = {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2], "group": group}
    got = run(
        "QConv", x, w, bias, mult, shift, **geo, out_dtype=out_dtype, rounding=mode, relu=relu
    )
    acc = ref_conv(x, w, geo["strides"], geo["pads"], geo["dilations"], group)
    acc = acc + bias.astype(object).reshape(1, 4, 1, 1)
    per_ch = (mult.reshape(1, 4, 1, 1), shift.reshape(1, 4, 1, 1))
    want = ref_req(acc, *per_ch, out_dtype, mode, relu)
    check(got, want, out_dtype)
    if out_dtype == "int8":
        assert got.min() == -128 * (1 - relu) and got.max() == 127  # both ends saturate


def test_qconv_1d_no_bias_one_multiplier_and_int32_output():
    rng = np.random.default_rng(7)
    x, w = rand_ints(rng, (1, 3, 9), np.int16), rand_ints(rng, (2, 3, 3), np.int8)
    got = run(
        "QConv",
        x,
        w,
        EMPTY,
        np.array([12345]),
        np.array([20]),
        out_dtype="int16",
        rounding="bpu_round",
    )
    acc = ref_conv(x, w, [1], [0, 0], [1], 1)
    check(got, ref_req(acc, 12345, 20, "int16", "bpu_round"), "int16")
    big = np.array([2**31 - 1, -(2**31)], dtype=np.int32)  # high precision output saturates
    out32 = run("QConv", x, w, big, EMPTY, EMPTY, out_dtype="int32", rounding="half_even")
    want = np.clip(acc + big.astype(object).reshape(1, 2, 1), -(2**31), 2**31 - 1)
    check(out32, want.astype(np.int64), "int32")
    assert out32[0, 0].max() == 2**31 - 1 and out32[0, 1].min() == -(2**31)


@pytest.mark.parametrize("mode", MODES)
def test_qlinear_and_qmatmul(mode):
    rng = np.random.default_rng(3)
    x, w = rand_ints(rng, (2, 3, 6), np.int8), rand_ints(rng, (5, 6), np.int8)
    bias, mult, shift = (
        rng.integers(-999, 999, 5),
        rng.integers(1, 2**15, 5),
        rng.integers(8, 16, 5),
    )
    got = run("QLinear", x, w, bias, mult, shift, out_dtype="int8", rounding=mode)
    acc = np.matmul(x.astype(object), w.T.astype(object)) + bias.astype(object)
    check(got, ref_req(acc, mult, shift, "int8", mode), "int8")
    a, b = rand_ints(rng, (2, 3, 4), np.int16), rand_ints(rng, (2, 4, 5), np.int16)
    got = run(
        "QMatMul", a, b, np.array([2**30 + 3]), np.array([45]), out_dtype="int16", rounding=mode
    )
    acc = np.matmul(a.astype(object), b.astype(object))
    check(got, ref_req(acc, 2**30 + 3, 45, "int16", mode), "int16")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", ["int8", "int16"])
def test_qadd_broadcast_per_channel_subtract_and_ties(mode, out_dtype):
    rng = np.random.default_rng(11)
    a, b = rand_ints(rng, (2, 3, 4, 4), np.int8), rand_ints(rng, (1, 3, 1, 4), np.int16)
    ma, mb = np.array([[[3000]], [[-7000]], [[9]]]), np.array(-31111)
    got = run("QAdd", a, b, ma, mb, np.array(8), out_dtype=out_dtype, rounding=mode, relu=1)
    acc = a.astype(object) * ma + b.astype(object) * int(mb)
    check(got, ref_req(acc, 1, 8, out_dtype, mode, relu=1), out_dtype)
    odd = np.array([1, 3, 5, -1, -3, -5, 127], np.int8)  # a + 0: x / 2, every one a tie
    got = run(
        "QAdd",
        odd,
        np.zeros(7, np.int8),
        np.array(1),
        np.array(1),
        np.array(1),
        out_dtype="int8",
        rounding=mode,
    )
    check(got, ref_req(odd, 1, 1, "int8", mode), "int8")


@pytest.mark.parametrize("mode", MODES)
def test_qmul_and_qrequant(mode):
    rng = np.random.default_rng(5)
    a, b = rand_ints(rng, (3, 4), np.int16), rand_ints(rng, (3, 4), np.int16)
    got = run("QMul", a, b, np.array([23456]), np.array([27]), out_dtype="int8", rounding=mode)
    check(got, ref_req(a.astype(object) * b.astype(object), 23456, 27, "int8", mode), "int8")
    x = rng.integers(-(2**31), 2**31, (2, 3, 4)).astype(np.int32)
    m, s = rng.integers(1, 2**31, 3), rng.integers(20, 40, 3)
    got = run("QRequant", x, m, s, axis=1, out_dtype="int16", rounding=mode)
    check(got, ref_req(x, m.reshape(1, 3, 1), s.reshape(1, 3, 1), "int16", mode), "int16")
    for attrs in ({"axis": -1}, {}):
        got = run("QRequant", x, m[:1], s[:1], **attrs, out_dtype="int32", rounding=mode)
        check(got, ref_req(x, m[0], s[0], "int32", mode), "int32")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_qavgpool(mode, include_pad):
    rng = np.random.default_rng(include_pad)
    x = rand_ints(rng, (2, 3, 5, 6), np.int8)
    geo = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 0, 0, 1]}
    for m, s in ((1, 0), (29000, 15), (2**20, 10)):  # exact ties, a ratio, saturation
        attrs = {**geo, "count_include_pad": include_pad, "out_dtype": "int8", "rounding": mode}
        got = run("QAvgPool", x, np.array(m), np.array(s), **attrs)
        args = ([2, 2], [2, 2], [1, 0, 0, 1], [1, 1], 0)
        sums = ref_pool(x, *args, lambda v, _: sum(v))
        counts = 4 if include_pad else ref_pool(x, *args, lambda _, inside: sum(inside))
        check(got, ref_div(sums, counts, m, s, "int8", mode), "int8")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_qreducemean_and_qreducesum(mode, keepdims):
    rng = np.random.default_rng(keepdims)
    x = rand_ints(rng, (2, 3, 4, 2), np.int16)
    sums = np.array(
        [[sum(int(v) for v in x[n, c].ravel()) for c in range(3)] for n in range(2)], object
    )
    shape = (2, 3, 1, 1) if keepdims else (2, 3)
    for m, s in ((1, 0), (3, 1), (40000, 14)):
        ms, red = (np.array(m), np.array(s)), {"keepdims": keepdims, "rounding": mode}
        got = run("QReduceMean", x, *ms, axes=[2, -1], out_dtype="int16", **red)
        check(got, ref_div(sums, 8, m, s, "int16", mode).reshape(shape), "int16")
        got = run("QReduceSum", x, *ms, axes=[2, 3], out_dtype="int8", **red)
        check(got, ref_div(sums, 1, m, s, "int8", mode).reshape(shape), "int8")
    total = run("QReduceMean", x, np.array(1), np.array(0), out_dtype="int16", rounding=mode)
    assert total.shape == (1, 1, 1, 1)
    assert total.item() == ref_round(Fraction(int(x.astype(np.int64).sum()), x.size), mode)


def test_qmaxpool_and_qclip():
    rng = np.random.default_rng(2)
    x = rand_ints(rng, (1, 2, 5, 5), np.int8)
    geo = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]}
    got = run("QMaxPool", x, **geo)
    want = ref_pool(x, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], -128, lambda v, _: max(v))
    check(got, want.astype(np.int64), "int8")
    for lo, hi in ((0, 127), (0, 6), (-1000, 1000), (-5, 5)):
        want = np.array([min(max(int(v), lo), hi) for v in x.ravel()]).reshape(x.shape)
        check(run("QClip", x, lo=lo, hi=hi), want, "int8")


def test_registered_and_errors():
    assert set(INT_OPS) <= set(CUSTOM_OPS)
    attrs, inits = {"relu": 1}, {"w": np.ones(2)}
    assert CUSTOM_OPS["QConv"].encode(attrs, inits) == (attrs, inits)
    x = np.ones((1, 1, 3, 3), np.int8)
    with pytest.raises(SimulatorError, match="rounding"):
        run("QAdd", x, x, np.array(1), np.array(1), np.array(0), out_dtype="int8")
    with pytest.raises(SimulatorError, match="expected 5"):
        run("QConv", x, x, out_dtype="int8", rounding="half_even")
    with pytest.raises(SimulatorError, match="no mult/shift"):
        run("QConv", x, x, EMPTY, EMPTY, EMPTY, out_dtype="int8", rounding="half_even")
    with pytest.raises(SimulatorError, match="biases"):
        run("QConv", x, x, np.ones(2), EMPTY, EMPTY, out_dtype="int32", rounding="half_even")
    with pytest.raises(SimulatorError, match="one mult"):
        run(
            "QAvgPool",
            x,
            np.ones(2),
            np.ones(2),
            kernel_shape=[2, 2],
            out_dtype="int8",
            rounding="half_even",
        )


def test_onnx_reference_runner_executes_int_ops():
    from onnx.reference import ReferenceEvaluator

    from stages.onnx_runner import custom_op_classes

    rng = np.random.default_rng(4)
    x, w = rand_ints(rng, (1, 2, 6, 6), np.int8), rand_ints(rng, (3, 2, 3, 3), np.int8)
    inits = {
        "w": w,
        "b": np.array([5, -5, 0], np.int32),
        "m": np.array([20000] * 3),
        "s": np.array([14] * 3),
    }
    conv_attrs = {"pads": [1, 1, 1, 1], "out_dtype": "int8", "rounding": "bpu_round", "relu": 1}
    nodes = [
        helper.make_node("QConv", ["x", *inits], ["c"], domain=DOMAIN, **conv_attrs),
        helper.make_node(
            "QMaxPool", ["c"], ["y"], domain=DOMAIN, kernel_shape=[2, 2], strides=[2, 2]
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT8, None)],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    (got,) = ReferenceEvaluator(model, new_ops=custom_op_classes()).run(None, {"x": x})
    conv = run("QConv", x, *inits.values(), **conv_attrs)
    check(got, run("QMaxPool", conv, kernel_shape=[2, 2], strides=[2, 2]), "int8")
    assert got.shape == (1, 3, 3, 3)
