"""The compiled int8 convolution (simulator/csrc/qconv.c) against the reference integer ops
(CUSTOM_OPS QConv, and QConv into QAdd for the fused add), and the library's build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import exec_native, native
from simulator.custom_ops import CUSTOM_OPS
from simulator.executor import Executor
from tests.simulator.test_exec_conv import EMPTY, MODES, _nhwc_program

pytestmark = pytest.mark.skipif(native.library() is None, reason=native.status())


def _native_plans(prog, feeds) -> tuple[np.ndarray, list]:
    ex = Executor(prog)
    out = ex.run(feeds)[0]["out"]
    plans = [v for k, v in ex.consts.derived.items() if k[0] == "conv_plan"]
    return out, [p.native for p in plans if p is not None]


@st.composite
def conv_cases(draw):
    """A random int8 conv: channels across 16-lane blocks, any geometry, extreme values."""
    c, o = draw(st.integers(1, 37)), draw(st.sampled_from([1, 5, 16, 17, 32, 40, 64, 70]))
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
    x = rng.integers(-128, 128, (draw(st.integers(1, 3)), c, h, w), dtype=np.int8)
    x.reshape(-1)[rng.random(x.size) < 0.1] = -128  # the unsigned offset's edge value
    wt = rng.integers(-128, 128, (o, c, *k), dtype=np.int8)
    attrs = {"rounding": draw(st.sampled_from(MODES)), "relu": draw(st.integers(0, 1)),
             "strides": strides, "pads": pads, "dilations": dil, "group": 1,
             "out_dtype": "int8"}  # fmt: skip
    bias = rng.integers(-(2**15), 2**15, o)
    if draw(st.booleans()):  # a float32 epilogue: |acc * mult| < 2**23 (module docstring)
        while (top := _acc_bound(wt, bias)) >= 2**21:
            wt, bias = wt // 2, bias // 2
        mult = rng.integers(1, max(2**23 // top, 2), o)
    else:
        mult = rng.integers(1, 2**20, o)
    shift = rng.integers(8, 24, o) + np.log2(mult.max()).astype(int)
    return x, wt, bias, mult, shift, attrs, rng


def _acc_bound(w: np.ndarray, bias: np.ndarray) -> int:
    return int(np.abs(w.astype(np.int64)).reshape(len(w), -1).sum(1).max()) * 128 + int(
        np.abs(bias).max()
    )


def _o_pad(o: int) -> int:
    return -(-o // 16) * 16


@settings(max_examples=60, deadline=None)
@given(case=conv_cases())
def test_native_conv_equals_qconv(case):
    x, w, bias, mult, shift, attrs, _ = case
    o, c = w.shape[:2]
    want = CUSTOM_OPS["QConv"].evaluate([x, w, bias, mult, shift], attrs)
    prog = _nhwc_program(x, w, [bias, mult, shift], attrs, c_pad=_o_pad(c), o_pad=_o_pad(o))
    got, plans = _native_plans(prog, {"x": x})
    f32 = _acc_bound(w, bias) * int(mult.max()) < 2 ** (23 + (attrs["rounding"] == "half_even"))
    assert [p.scale.dtype for p in plans] == [torch.float32 if f32 else torch.float64]
    np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(case=conv_cases(), per_channel=st.booleans())
def test_native_fused_conv_add_equals_qconv_then_qadd(case, per_channel):
    x, w, bias, _, _, attrs, rng = case
    o, c = w.shape[:2]
    acc = CUSTOM_OPS["QConv"].evaluate([x, w, bias, EMPTY, EMPTY],
                                       {**attrs, "out_dtype": "int32", "relu": 0})  # fmt: skip
    b = rng.integers(-128, 128, acc.shape, dtype=np.int8)
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
def test_float32_epilogue_only_below_its_limit(mode, below):
    """``|acc * m|`` just below the float32 limit runs in float32, at it in float64; both
    exact on inputs that reach the bound (all -128 against all -128 weights)."""
    limit = 2**24 if mode == "half_even" else 2**23
    c, k = 8, 3
    a = c * k * k * 128 * 128  # acc_bound with no bias
    m = (limit - 1) // a if below else limit // a + 1
    x = np.full((1, c, 5, 5), -128, np.int8)
    w = np.full((2, c, k, k), -128, np.int8)
    w[1] = 127
    attrs = {"rounding": mode, "relu": 0, "strides": [1, 1], "pads": [1, 1, 1, 1],
             "dilations": [1, 1], "group": 1, "out_dtype": "int8"}  # fmt: skip
    mult, shift = np.full(2, m), np.full(2, 22)
    want = CUSTOM_OPS["QConv"].evaluate([x, w, np.zeros(2, np.int64), mult, shift], attrs)
    prog = _nhwc_program(x, w, [np.zeros(2, np.int64), mult, shift], attrs)
    got, plans = _native_plans(prog, {"x": x})
    assert [p.scale.dtype for p in plans] == [torch.float32 if below else torch.float64]
    np.testing.assert_array_equal(got, want)


def test_int16_input_or_output_stays_on_the_torch_path():
    rng = np.random.default_rng(3)
    x, w = rng.integers(-128, 128, (1, 4, 5, 5), dtype=np.int8), np.ones((3, 4, 3, 3), np.int8)
    attrs = {"rounding": "half_even", "relu": 0, "strides": [1, 1], "pads": [0, 0, 0, 0],
             "dilations": [1, 1], "group": 1, "out_dtype": "int16"}  # fmt: skip
    consts = [np.zeros(3, np.int64), np.full(3, 5), np.full(3, 3)]
    got, plans = _native_plans(_nhwc_program(x, w, consts, attrs), {"x": x})
    assert plans == [None]
    np.testing.assert_array_equal(got, CUSTOM_OPS["QConv"].evaluate([x, w, *consts], attrs))


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


def test_build_is_cached_and_reports_a_missing_compiler(tmp_path, monkeypatch):
    first = native.build(tmp_path)
    assert native.build(tmp_path) == first and first.parent == tmp_path
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(RuntimeError, match="no C compiler"):
        native.build(tmp_path / "other")


def test_build_failure_names_the_command(tmp_path, monkeypatch):
    fake = tmp_path / "cc"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo fake && exit 0\necho boom >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(RuntimeError, match="failed: boom"):
        native.build(tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.so"))  # no half-written library left behind
