"""encode -> evaluate of every custom op returns exactly what the simulator computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from schemas.errors import SimulatorError
from simulator.arith import composite as c
from simulator.arith import fixedpoint as fp
from simulator.arith import lut
from simulator.arith.custom_ops import CUSTOM_OPS, DOMAIN
from simulator.arith.int_ops import INT_OPS

RNG = np.random.default_rng(0)


def _encode(op: str, obj, **kw):
    attrs, inits = CUSTOM_OPS[op].encode(obj, **kw)
    for v in attrs.values():  # ONNX attributes: plain Python scalars and strings
        assert type(v) in (int, float, str), (op, v)
    assert all(isinstance(v, np.ndarray) for v in inits.values())
    return attrs, inits


def _evaluate(op: str, x, attrs, inits):
    return CUSTOM_OPS[op].evaluate([x, *inits.values()], attrs)


def test_table_of_ops():
    assert DOMAIN == "qparity"
    assert set(CUSTOM_OPS) == {"Lut", "Softmax", "LayerNorm", "QuantizeLinear"} | set(INT_OPS)


@pytest.mark.parametrize("kind", ["direct", "segmented"])
def test_lut_round_trip(kind):
    if kind == "direct":
        values = np.tanh(np.arange(-128, 128, dtype=np.float32) / 32)
        t = lut.build_direct_table("tanh", values, 1 / 32, 1 / 127, "int8", "bpu_round")
    else:
        t = lut.build_segmented_table("exp", np.exp, 3e-4, 2.0**-15, "int16", "half_even",
                                      dividing="curvature", domain=(-9, 0))  # fmt: skip
    attrs, inits = _encode("Lut", t)
    assert list(inits) == list(lut.ARRAY_FIELDS)
    q = np.arange(*fp.qrange(t.in_dtype))
    assert np.array_equal(_evaluate("Lut", q, attrs, inits), lut.lookup(t, q))


def test_softmax_round_trip():
    t = c.build_softmax(0.05, "int8", 1 / 127, "int8", "bpu_round", 10)
    attrs, inits = _encode("Softmax", t, axis=1)
    assert attrs["axis"] == 1 and list(inits)[:2] == ["exp_entries", "exp_bounds"]
    q = RNG.integers(-128, 128, (3, 10, 4))
    assert np.array_equal(_evaluate("Softmax", q, attrs, inits), c.int_softmax(q, 1, t))


def test_layernorm_round_trip():
    n = 32
    w, b = RNG.uniform(0.5, 2, n), RNG.normal(0, 1, n)
    t = c.build_layernorm(1e-3, "int16", 2e-4, "int16", "half_even", n, 1e-5, w, b)
    attrs, inits = _encode("LayerNorm", t)
    assert list(inits)[-2:] == ["weight_q", "bias_q"]
    q = RNG.integers(-32768, 32768, (5, n))
    assert np.array_equal(_evaluate("LayerNorm", q, attrs, inits), c.int_layernorm(q, t))


@pytest.mark.parametrize("mode", fp.ROUNDING_MODES)
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_quantize_linear(mode, dtype):
    x = (RNG.normal(0, 2, (2, 3, 4)) * 8).round() / 16  # plenty of exact .5 ties
    x = x.astype(np.float32)
    attrs, inits = _encode("QuantizeLinear", 0.0625, dtype=dtype, rounding=mode)
    got = _evaluate("QuantizeLinear", x, attrs, inits)
    assert got.dtype == np.dtype(dtype)
    assert got.tolist() == fp.quantize(torch.from_numpy(x), 0.0625, dtype, mode).tolist()
    scales = np.array([0.1, 0.0625, 0.3], dtype=np.float32)
    attrs, inits = _encode("QuantizeLinear", scales, axis=1, dtype=dtype, rounding=mode)
    want = fp.quantize(x, scales, dtype, mode, ch_axis=1)
    assert np.array_equal(_evaluate("QuantizeLinear", x, attrs, inits), want)


def test_bad_inputs_raise():
    t = c.build_softmax(0.05, "int8", 1 / 127, "int8", "bpu_round", 10)
    attrs, inits = CUSTOM_OPS["Softmax"].encode(t)
    with pytest.raises(SimulatorError, match="inputs"):
        CUSTOM_OPS["Softmax"].evaluate([np.zeros(3, dtype=np.int64)], attrs)
    with pytest.raises(SimulatorError, match="rounding"):
        CUSTOM_OPS["QuantizeLinear"].encode(0.1, rounding="up")
