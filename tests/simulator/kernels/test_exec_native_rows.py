"""The compiled row kernels (simulator/csrc/qrows.c) against the reference integer ops
QReduceMean and QMul, and the cases they leave to the torch path."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.arith import fixedpoint as fp
from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.kernels import exec_native_rows
from simulator.kernels.exec_epilogue import add_epilogue
from simulator.program.isa import Op
from simulator.runtime import native
from tests.simulator.runtime.test_executor import MODES, check, req_consts

pytestmark = [pytest.mark.skipif(native.library() is None, reason=native.status()),
              pytest.mark.usefixtures("pool_threads")]  # conftest.py: 1 and 3 threads
DTYPES = (np.int8, np.int16)


def _ints(rng, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    x.reshape(-1)[rng.random(x.size) < 0.1] = info.min  # extremes reach the bounds
    return x


@contextlib.contextmanager
def _spy(name: str):
    """Record what ``exec_native_rows.<name>`` returns (None: the torch path ran)."""
    calls, real = [], getattr(exec_native_rows, name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exec_native_rows, name, lambda *a: calls.append(real(*a)) or calls[-1])
        yield calls


def _attrs(draw) -> dict:
    return {"rounding": draw(st.sampled_from(MODES)), "relu": draw(st.integers(0, 1)),
            "out_dtype": draw(st.sampled_from(["int8", "int16", "int32"]))}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31))  # fmt: skip
def test_mean_equals_qreducemean(data, shape, dtype, seed):
    """Any block of adjacent axes in the kernel (asserted); small shifts make exact ties
    frequent."""
    rng = np.random.default_rng(seed)
    x = _ints(rng, shape, dtype)
    k = data.draw(st.integers(1, len(shape)))
    first = data.draw(st.integers(0, len(shape) - k))  # trailing, or between other axes
    axes = list(range(first, first + k))
    attrs = {**_attrs(data.draw), "axes": axes, "keepdims": data.draw(st.integers(0, 1))}
    m = np.array([int(rng.integers(1, 2**15))])
    s = np.array([int(data.draw(st.sampled_from([0, 1, 2, 5, 12])))])
    with _spy("mean") as calls:
        check(Op.REDUCE_MEAN, "QReduceMean", [x], [m, s], attrs)
    assert calls and calls[0] is not None


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       per_row=st.integers(0, 4), swap=st.booleans(), seed=st.integers(0, 2**31))  # fmt: skip
def test_mul_equals_qmul(data, shape, per_row, swap, seed):
    """Same shapes, or b constant along a's last ``per_row`` axes, in either order."""
    rng = np.random.default_rng(seed)
    a = _ints(rng, shape, data.draw(st.sampled_from(DTYPES)))
    j = max(len(shape) - per_row, 0)
    b = _ints(rng, (*shape[:j], *[1] * (len(shape) - j)), data.draw(st.sampled_from(DTYPES)))
    a, b = (b, a) if swap else (a, b)
    m = np.array([int(rng.integers(1, 2**15))])
    s = np.array([int(data.draw(st.sampled_from([0, 1, 3, 14, 20])))])
    with _spy("mul") as calls:
        check(Op.MUL, "QMul", [a, b], [m, s], _attrs(data.draw))
    assert calls and calls[0] is not None


def test_other_broadcasts_and_per_channel_constants_stay_on_the_torch_path():
    rng = np.random.default_rng(5)
    a, m, s = _ints(rng, (2, 3, 4), np.int8), np.array([3]), np.array([2])
    attrs = {"rounding": "half_even", "relu": 0, "out_dtype": "int8"}
    column = torch.from_numpy(_ints(rng, (1, 3, 4), np.int8))  # broadcast over leading axes
    ta = torch.from_numpy(a)
    assert exec_native_rows.mul(ta, column, torch.tensor(m), torch.tensor(s), attrs) is None
    per_channel = torch.tensor([1, 2, 3]).reshape(3, 1)
    assert exec_native_rows.mul(ta, ta, per_channel, torch.tensor(s), attrs) is None
    assert exec_native_rows.mean(ta, (0, 2), True, torch.tensor(m), torch.tensor(s), attrs) is None
    check(Op.MUL, "QMul", [a, column.numpy()], [m, s], attrs)
    check(Op.REDUCE_MEAN, "QReduceMean", [a], [m, s], {**attrs, "axes": [0, 2], "keepdims": 1})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_round_like_the_reference(mode, dtype):
    """Every value from -20.5 to 20.5 in steps of 0.5: the ties of both rounding modes,
    negative and positive, through the mean (pairs, n = 2) and the product (m * 2**-1)."""
    v = np.arange(-41, 42).astype(dtype)
    attrs = {"rounding": mode, "relu": 0, "out_dtype": "int8"}
    one, zero = np.array([1]), np.array([0])
    pairs = np.stack([v, np.zeros_like(v)], axis=1)  # mean of (v, 0) = v / 2
    with _spy("mean") as calls:
        check(Op.REDUCE_MEAN, "QReduceMean", [pairs], [one, zero], {**attrs, "axes": [1]})
    with _spy("mul") as more:
        check(Op.MUL, "QMul", [v, np.ones_like(v)], [one, one], attrs)
    assert calls[0] is not None and more[0] is not None


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 4), c=st.integers(1, 20), pad=st.integers(0, 5),
       h=st.integers(1, 6), w=st.integers(1, 6), seed=st.integers(0, 2**31))  # fmt: skip
def test_channels_last_views_equal_the_reference(data, n, c, pad, h, w, seed):
    """An NHWC buffer with padding channels seen as NCHW (LAYOUT ToNCHW's view): the mean
    over H, W and the product with an [N, C, 1, 1] operand read it in place."""
    rng = np.random.default_rng(seed)
    dt = data.draw(st.sampled_from(DTYPES))
    buf = torch.from_numpy(_ints(rng, (n, h, w, c + pad), dt))
    view = buf[..., :c].permute(0, 3, 1, 2)
    assert exec_native_rows.channels_last(view) == (c + pad, h * w * (c + pad))
    attrs = _attrs(data.draw)
    m, s = np.array([int(rng.integers(1, 2**15))]), np.array([int(rng.integers(0, 16))])
    keep = data.draw(st.integers(0, 1))
    got = exec_native_rows.mean(view, (2, 3), bool(keep), torch.tensor(m), torch.tensor(s), attrs)
    dense = np.ascontiguousarray(view.numpy())
    red = {**attrs, "axes": [2, 3], "keepdims": keep}
    np.testing.assert_array_equal(
        got.numpy(), CUSTOM_OPS["QReduceMean"].evaluate([dense, m, s], red)
    )
    b = _ints(rng, (n, c, 1, 1), data.draw(st.sampled_from(DTYPES)))
    got = exec_native_rows.mul(view, torch.from_numpy(b), torch.tensor(m), torch.tensor(s), attrs)
    assert got.stride(1) == 1 or view.is_contiguous()  # channels-last out, as in
    np.testing.assert_array_equal(got.numpy(), CUSTOM_OPS["QMul"].evaluate([dense, b, m, s], attrs))


ADD_DTYPES = (np.int8, np.int16, np.int32)


LAST = st.one_of(st.integers(1, 40), st.sampled_from([8, 16, 32, 48]))
SHAPES = st.tuples(st.lists(st.integers(1, 5), max_size=3), LAST).map(lambda t: [*t[0], t[1]])
"""Up to 4 axes, the last up to 48 wide: more than one vector of 16 (float32) or 8 lanes;
whole vectors per row (the kernels' flat blocks) or a tail."""


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=SHAPES, lead=st.integers(0, 3), swap=st.booleans(),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_add_equals_qadd(data, shape, lead, swap, seed):
    """Same shapes or b broadcast over ``lead`` leading axes, either order; scalar or
    last-axis per-channel multipliers; int8 / int16 / int32 operands."""
    rng = np.random.default_rng(seed)
    a = _ints(rng, shape, data.draw(st.sampled_from(ADD_DTYPES)))
    lead = min(lead, len(shape) - 1)
    b = _ints(rng, (*[1] * lead, *shape[lead:]), data.draw(st.sampled_from(ADD_DTYPES)))
    c = shape[-1]
    ma = rng.integers(-(2**14), 2**14, c if data.draw(st.booleans()) else 1)
    mb = rng.integers(-(2**14), 2**14, c if data.draw(st.booleans()) else 1)
    a, b, ma, mb = (b, a, mb, ma) if swap else (a, b, ma, mb)
    sh = np.array([int(data.draw(st.sampled_from([0, 1, 7, 20, 40])))])
    with _spy("add") as calls:
        check(Op.ADD, "QAdd", [a, b], [ma, mb, sh], _attrs(data.draw))
    bound = sum(-int(np.iinfo(v.dtype).min) * int(np.abs(m).max()) for v, m in ((a, ma), (b, mb)))
    native_expected = bound < 2**52  # add_epilogue's float64 bound (bpu_round's is lower)
    assert calls and (calls[0] is not None or not native_expected)


@pytest.mark.parametrize("mode", MODES)
def test_add_in_float32_rounds_ties_as_the_reference(mode):
    """int8 operands with 15-bit multipliers: add_epilogue proves float32 exact and the
    kernel runs sixteen float32 lanes; every a and b value against ties (shift 1) and
    37 channels (two vectors and a tail)."""
    a = np.resize(np.arange(-128, 128, dtype=np.int8), (9, 37))
    b = np.resize(np.arange(127, -129, -1, dtype=np.int8), (9, 37))
    ma, mb = np.arange(1, 38) * 881 % 2**15, np.array([-(2**15) + 1])
    epi = add_epilogue({"rounding": mode, "relu": 0, "out_dtype": "int16"}, torch.int8,
                       torch.int8, torch.from_numpy(ma), torch.from_numpy(mb),
                       torch.tensor([1]))  # fmt: skip
    assert epi is not None and epi.ftype == torch.float32
    with _spy("add") as calls:
        check(Op.ADD, "QAdd", [a, b], [ma, mb, np.array([1])],
              {"rounding": mode, "relu": 0, "out_dtype": "int16"})  # fmt: skip
    assert calls[0] is not None


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=SHAPES, per_channel=st.booleans(), seed=st.integers(0, 2**31))
def test_requant_equals_qrequant(data, shape, per_channel, seed):
    """Scalar or last-axis multipliers and shifts (exact ties at small shifts) on int8 /
    int16 / int32 inputs run in the QAdd kernel with a zero second scale (15-bit
    multipliers keep even int32 inputs below the float64 bound); no multiplier (an int32
    output that only saturates) stays on the torch path."""
    rng = np.random.default_rng(seed)
    x = _ints(rng, shape, data.draw(st.sampled_from(ADD_DTYPES)))
    attrs = _attrs(data.draw)
    mult, shift = req_consts(rng, shape[-1], per_channel, attrs["out_dtype"])
    axis = len(shape) - 1 if per_channel else -1
    with _spy("requant") as calls:
        check(Op.REQUANT, "QRequant", [x], [mult, shift], {**attrs, "axis": axis})
    assert calls and (calls[0] is not None) == (mult.size > 0)


@settings(max_examples=50, deadline=None)
@given(data=st.data(), batch=st.lists(st.integers(1, 4), min_size=1, max_size=2),
       m=st.integers(1, 9), k=st.one_of(st.integers(1, 40), st.integers(171, 260)),
       n=st.integers(1, 20),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_bmm_equals_qmatmul(data, batch, m, k, n, seed):
    """K up to 40 widens each batch's b once; K above 170 (b too big for the kernel's
    buffer) widens it on the fly."""
    rng = np.random.default_rng(seed)
    a = _ints(rng, (*batch, m, k), data.draw(st.sampled_from(DTYPES)))
    b = _ints(rng, (*batch, k, n), data.draw(st.sampled_from(DTYPES)))
    mult = np.array([int(rng.integers(1, 2**12))])
    s = np.array([int(data.draw(st.sampled_from([0, 1, 9, 20, 30])))])
    with _spy("bmm") as calls:
        check(Op.MATMUL, "QMatMul", [a, b], [mult, s], _attrs(data.draw))
    assert calls and calls[0] is not None


@settings(max_examples=40, deadline=None)
@given(data=st.data(), qmin=st.integers(-200, 10), width=st.integers(1, 300),
       shape=st.lists(st.integers(1, 9), min_size=0, max_size=3), seed=st.integers(0, 2**31))  # fmt: skip
def test_gather_equals_clamped_indexing(data, qmin, width, shape, seed):
    """Inputs beyond [qmin, qmax] saturate, as lut.lookup does; every dtype pair; tables
    starting off a 4-byte boundary (the kernel gathers aligned words)."""
    rng = np.random.default_rng(seed)
    vdt = data.draw(st.sampled_from(ADD_DTYPES))
    lead = data.draw(st.integers(0, 3))
    values = _ints(rng, (width + lead,), vdt)[lead:]
    q = rng.integers(qmin - 50, qmin + width + 50, shape)
    dt = data.draw(st.sampled_from(ADD_DTYPES))
    q = np.asarray(np.clip(q, np.iinfo(dt).min, np.iinfo(dt).max).astype(dt))
    qmax = qmin + width - 1
    want = values[np.clip(q.astype(np.int64), qmin, qmax) - qmin]
    got = exec_native_rows.gather(torch.from_numpy(values), qmin, qmax, torch.from_numpy(q))
    assert got is not None and got.dtype == torch.from_numpy(values).dtype
    np.testing.assert_array_equal(got.numpy(), want)


def test_gather_of_more_than_a_block():
    """A lookup of several 4096-value blocks (the kernel's tasks) fills every block."""
    rng = np.random.default_rng(7)
    values = rng.integers(-128, 128, 256).astype(np.int8)
    q = rng.integers(-300, 300, (3, 4101)).astype(np.int16)
    got = exec_native_rows.gather(torch.from_numpy(values), -128, 127, torch.from_numpy(q))
    np.testing.assert_array_equal(got.numpy(), values[np.clip(q, -128, 127) + 128])


def _torch_quantize(x: torch.Tensor, s: torch.Tensor, axis, dtype: str, mode: str):
    """k_quantize's torch formula: round_by(x / s) in x's float type, clamp, cast."""
    s = s.to(x.dtype).reshape(
        [-1 if i == axis else 1 for i in range(x.ndim)] if axis is not None else ()
    )
    q = fp.round_by(x / s, mode) if mode != "half_even" else (x / s).round_()
    return q.clamp_(*fp.qrange(dtype)).to(getattr(torch, dtype))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       f64=st.booleans(), seed=st.integers(0, 2**31))  # fmt: skip
def test_quantize_equals_the_torch_formula(data, shape, f64, seed):
    """Ties (halves of power-of-two scales), the float just below 0.5, values far out of
    range, per-channel or one scale, float32 and float64."""
    rng = np.random.default_rng(seed)
    ft = torch.float64 if f64 else torch.float32
    axis = data.draw(st.sampled_from([None, *range(len(shape))]))
    c = 1 if axis is None else shape[axis]
    pow2 = data.draw(st.booleans())
    s = torch.tensor(2.0 ** rng.integers(-6, 3, c) if pow2 else rng.uniform(0.001, 2.0, c))
    x = torch.from_numpy(rng.normal(0, 1, shape) * rng.choice([0.01, 1, 50, 1e5]))
    halves = torch.from_numpy(rng.integers(-300, 300, shape) + 0.5)
    x = torch.where(torch.from_numpy(rng.random(shape) < 0.3), halves * s.max(), x).to(ft)
    x.reshape(-1)[0] = float(np.nextafter(np.float32(0.5), 0)) * float(s.reshape(-1)[0])
    dtype, mode = data.draw(st.sampled_from(["int8", "int16"])), data.draw(st.sampled_from(MODES))
    got = exec_native_rows.quantize(x, s, axis, dtype, mode)
    np.testing.assert_array_equal(got.numpy(), _torch_quantize(x, s, axis, dtype, mode).numpy())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.sampled_from([0.0207, 0.37, 3.1e-3, 1.7, 2e-38, 1e38]),
       mode=st.sampled_from(MODES), dtype=st.sampled_from(["int8", "int16"]))  # fmt: skip
def test_float32_quantize_at_and_beside_every_tie(seed, scale, mode, dtype):
    """Float32 inputs at h * s for half-integers h, an ulp either side and a few ulps
    further, magnitudes up to 2^21, scales whose reciprocal is not a normal float: the
    same integers as x / s in float32 (a kernel that divides by a multiply, tried, gives
    other integers here)."""
    rng = np.random.default_rng(seed)
    s = np.float32(scale)
    h = rng.integers(-(2**21), 2**21, 512) * rng.choice([1e-5, 1e-3, 1.0], 512) // 1 + 0.5
    with np.errstate(over="ignore"):
        at = (h * s).astype(np.float32)
    at = at[np.isfinite(at)]  # 1e38 times 2 and more is past float32
    steps = rng.integers(-3, 4, len(at)).astype(np.float32)
    x = np.concatenate([at, np.nextafter(at, np.inf), np.nextafter(at, -np.inf),
                        at + steps * np.spacing(at)]).astype(np.float32)  # fmt: skip
    xt, st_ = torch.from_numpy(x), torch.tensor([float(s)], dtype=torch.float64)
    got = exec_native_rows.quantize(xt, st_, None, dtype, mode)
    np.testing.assert_array_equal(got.numpy(), _torch_quantize(xt, st_, None, dtype, mode).numpy())


@pytest.mark.parametrize("axis", [None, 1])
def test_quantize_of_channels_longer_than_a_task(axis):
    """Channels of more than 8192 values split into tasks (a batch-1 image spreads over
    the threads): each value still gets its channel's scale, and a NaN in a channel's last
    task still sends the input to the torch path."""
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.normal(0, 3, (2, 3, 97, 95)))
    s = torch.tensor([0.02, 0.05, 0.11] if axis == 1 else [0.05], dtype=torch.float64)
    want = _torch_quantize(x, s, axis, "int8", "half_even")
    got = exec_native_rows.quantize(x, s, axis, "int8", "half_even")
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    x[1, 2, 96, 94] = float("nan")
    assert exec_native_rows.quantize(x, s, axis, "int8", "half_even") is None


def test_quantize_leaves_non_finite_inputs_to_the_torch_path():
    x = torch.tensor([1.0, float("nan"), 2.0])
    assert exec_native_rows.quantize(x, torch.tensor([0.1]), None, "int8", "bpu_round") is None


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(1, 20), min_size=1, max_size=4),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_dequantize_equals_the_float32_product(data, shape, seed):
    """float32(q) * float32(s), scalar or per channel along any axis; int32 values past
    2**24 round in the conversion exactly as torch's."""
    rng = np.random.default_rng(seed)
    q = torch.from_numpy(_ints(rng, shape, data.draw(st.sampled_from(ADD_DTYPES))))
    axis = data.draw(st.sampled_from([None, *range(len(shape))]))
    c = 1 if axis is None else shape[axis]
    s = torch.from_numpy(rng.uniform(1e-4, 3.0, c))  # float64, as the program stores it
    got = exec_native_rows.dequantize(q, s, axis)
    view = [-1 if i == axis else 1 for i in range(q.ndim)] if axis is not None else ()
    want = q.float() * s.float().reshape(view)
    assert got is not None and got.dtype == torch.float32 and torch.equal(got, want)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), nb=st.integers(1, 3), heads=st.integers(1, 3), m=st.integers(1, 9),
       k=st.integers(1, 20), n=st.integers(1, 19), seed=st.integers(0, 2**31))  # fmt: skip
def test_bmm_reads_transposed_views_in_place(data, nb, heads, m, k, n, seed):
    """q @ k^T as the transformer runs it: a head split (a permuted view) times a
    transposed buffer, both read in place with their strides, equals QMatMul on the
    materialized operands."""
    from simulator.program.isa import Instruction, Program
    from simulator.runtime.executor import Executor

    rng = np.random.default_rng(seed)
    dt = data.draw(st.sampled_from(DTYPES))
    a = _ints(rng, (nb, m, heads, k), dt)  # [N, tokens, heads, d] before the head split
    bt = _ints(rng, (nb, heads, n, k), data.draw(st.sampled_from(DTYPES)))  # b^T, contiguous
    mult, s = np.array([int(rng.integers(1, 2**12))]), np.array([int(rng.integers(0, 21))])
    attrs = _attrs(data.draw)
    instrs = [
        Instruction(Op.LAYOUT, ("a",), ("ah",), (), {"op_type": "Transpose", "perm": [0, 2, 1, 3]}),
        Instruction(Op.LAYOUT, ("bt",), ("b",), (), {"op_type": "Transpose", "perm": [0, 1, 3, 2]}),
        Instruction(Op.MATMUL, ("ah", "b"), ("y",), ("m", "s"), attrs),
    ]
    prog = Program("nash-e", {"a": {"dtype": str(a.dtype)}, "bt": {"dtype": str(bt.dtype)}},
                   {"y": {}}, instrs, {"m": mult, "s": s})  # fmt: skip
    with _spy("bmm") as calls:
        got = Executor(prog).run({"a": a, "bt": bt})[0]["y"]
    ah, b = np.ascontiguousarray(a.transpose(0, 2, 1, 3)), np.ascontiguousarray(bt.swapaxes(2, 3))
    want = CUSTOM_OPS["QMatMul"].evaluate([ah, b, mult, s], attrs)
    assert calls and calls[0] is not None and got.dtype == np.dtype(attrs["out_dtype"])
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), g=st.integers(1, 6), m=st.integers(1, 11), k=st.integers(1, 32),
       n=st.integers(1, 16), seed=st.integers(0, 2**31))  # fmt: skip
def test_bmm_pairs_equals_qmatmul(data, g, m, k, n, seed):
    """The VPDPWSSD form (K <= 32, N <= 16, int32 sums proven exact from the dtypes) on b
    read by rows (contiguous) or by columns (a transposed view in place) equals QMatMul,
    extremes included; past the int32 bound the float64 form runs instead."""
    from simulator.program.isa import Instruction, Program
    from simulator.runtime.executor import Executor

    rng = np.random.default_rng(seed)
    dta, dtb = data.draw(st.sampled_from(DTYPES)), data.draw(st.sampled_from(DTYPES))
    a, bt = _ints(rng, (g, m, k), dta), _ints(rng, (g, n, k), dtb)
    by_columns = data.draw(st.booleans())
    feed = bt if by_columns else np.ascontiguousarray(bt.swapaxes(1, 2))
    mult, s = np.array([int(rng.integers(1, 2**10))]), np.array([int(rng.integers(10, 30))])
    attrs = _attrs(data.draw)
    perm = {"op_type": "Transpose", "perm": [0, 2, 1] if by_columns else [0, 1, 2]}
    instrs = [Instruction(Op.LAYOUT, ("bin",), ("b",), (), perm),
              Instruction(Op.MATMUL, ("a", "b"), ("y",), ("m", "s"), attrs)]  # fmt: skip
    prog = Program("nash-e", {"a": {"dtype": str(a.dtype)}, "bin": {"dtype": str(feed.dtype)}},
                   {"y": {}}, instrs, {"m": mult, "s": s})  # fmt: skip
    with native.tracing() as trace:
        got = Executor(prog).run({"a": a, "bin": feed})[0]["y"]
    want = CUSTOM_OPS["QMatMul"].evaluate(
        [a, np.ascontiguousarray(bt.swapaxes(1, 2)), mult, s], attrs
    )
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype
    exact = k * (128 if dta == np.int8 else 32768) * (128 if dtb == np.int8 else 32768) < 2**31
    names = [fn.__name__ for fn, _, _ in trace.calls]
    assert names == ["qp_bmm_pairs"] if exact else "qp_bmm_pairs" not in names


def test_gather_leaves_a_misaligned_table_to_the_torch_path():
    """An int16 table at an odd address (possible from numpy, never from torch) could
    straddle two of the kernel's 4-byte words: None, the caller's torch path."""
    raw = bytearray(np.arange(21, dtype=np.uint8).tobytes())  # writable: torch shares it
    values = np.frombuffer(raw, dtype=np.int16, count=10, offset=1)
    t = torch.from_numpy(values.copy())
    q = torch.arange(-3, 12, dtype=torch.int16)
    assert exec_native_rows.gather(t, 0, 9, q) is not None  # aligned: the kernel
    odd = torch.from_numpy(values)
    assert odd.data_ptr() % 2 == 1 and exec_native_rows.gather(odd, 0, 9, q) is None
