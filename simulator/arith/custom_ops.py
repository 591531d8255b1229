"""Custom ONNX ops (domain ``qparity``) for what standard ONNX cannot express.

One table, :data:`CUSTOM_OPS`, maps an op type to ``CustomOp(encode, evaluate)``:

- ``encode(obj, **kw) -> (attrs, initializers)``: attrs are Python scalars/strings,
  initializers numpy arrays keyed by a name suffix. The order of ``initializers`` is the
  order of the node's inputs after the data input.
- ``evaluate(inputs, attrs) -> np.ndarray``: ``inputs[0]`` is the data tensor,
  ``inputs[1:]`` the initializers in that order. The result is exactly what
  :func:`~simulator.arith.lut.lookup`, :func:`~simulator.arith.composite.int_softmax`,
  :func:`~simulator.arith.composite.int_layernorm` or :func:`~simulator.arith.fixedpoint.quantize`
  return on the same tables.

Inputs per op (after the data input):

- ``Lut``: entries, bounds, mults, shifts (:data:`simulator.arith.lut.ARRAY_FIELDS`).
- ``Softmax``: exp_entries, exp_bounds, exp_mults, exp_shifts, then recip_* likewise.
- ``LayerNorm``: rsqrt_entries, rsqrt_bounds, rsqrt_mults, rsqrt_shifts, weight_q, bias_q.
- ``QuantizeLinear``: scale (one value per tensor, or one per channel along ``axis``).
- The integer ops of quantized.onnx (``QConv``, ``QLinear``, ``QAdd``...): inputs,
  attributes and formulas in :mod:`simulator.arith.int_ops`; their encode is the identity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from schemas.errors import SimulatorError
from simulator.arith import fixedpoint as fp
from simulator.arith.composite import LayerNormTables, SoftmaxTables, int_layernorm, int_softmax
from simulator.arith.int_ops import INT_OPS, encode
from simulator.arith.lut import ARRAY_FIELDS, LutTable, from_arrays, lookup, to_arrays

DOMAIN = "qparity"
_NP_DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32}


@dataclass(frozen=True)
class CustomOp:
    """Encoder (tables -> attrs + initializers) and evaluator (inputs + attrs -> ints)."""

    encode: Callable[..., tuple[dict, dict[str, np.ndarray]]]
    evaluate: Callable[[list[np.ndarray], dict], np.ndarray]


def _split(obj, prefix: str = "") -> tuple[dict, dict[str, np.ndarray]]:
    """Dataclass fields as (attrs, arrays); nested LutTables get ``<field>_`` prefixes."""
    attrs, arrays = {}, {}
    items = to_arrays(obj).items() if isinstance(obj, LutTable) else vars(obj).items()
    for name, v in items:
        if isinstance(v, LutTable):
            a, arr = _split(v, f"{prefix}{name}_")
            attrs.update(a)
            arrays.update(arr)
        elif isinstance(v, np.ndarray):
            arrays[prefix + name] = np.asarray(v, dtype=np.int64)
        else:
            attrs[prefix + name] = v
    return attrs, arrays


def decode(cls, attrs: dict, arrays: list[np.ndarray], prefix: str = ""):
    """Inverse of :func:`_split`: rebuild ``cls`` consuming ``arrays`` in field order.

    LutTable: scalars from ``attrs[prefix + field]`` (all required), then entries, bounds,
    mults, shifts; SoftmaxTables / LayerNormTables: fields in declaration order, nested
    tables under ``<field>_``. Used by the ONNX evaluators and the BPU executor alike.
    """
    if cls is LutTable:
        d = {f.name: attrs[prefix + f.name] for f in fields(LutTable) if f.name not in ARRAY_FIELDS}
        d.update({name: arrays.pop(0) for name in ARRAY_FIELDS})
        return from_arrays(d)
    kw = {}
    for f in fields(cls):
        if f.type == "LutTable":
            kw[f.name] = decode(LutTable, attrs, arrays, f"{prefix}{f.name}_")
        elif f.type == "np.ndarray":
            kw[f.name] = np.asarray(arrays.pop(0), dtype=np.int64)
        else:
            kw[f.name] = attrs[prefix + f.name]
    return cls(**kw)


def _check_inputs(op: str, inputs: list, want: int) -> None:
    if len(inputs) != want:
        raise SimulatorError(
            f"{op} got {len(inputs)} inputs, expected {want}",
            where=f"{DOMAIN}.{op}",
            hint="pass the data input followed by the initializers in encode order",
        )


def _lut_encode(table: LutTable):
    return _split(table)


def _lut_evaluate(inputs, attrs):
    _check_inputs("Lut", inputs, 5)
    return lookup(decode(LutTable, attrs, list(inputs[1:])), inputs[0])


def _softmax_encode(tables: SoftmaxTables, *, axis: int = -1):
    attrs, arrays = _split(tables)
    return {"axis": int(axis), **attrs}, arrays


def _softmax_evaluate(inputs, attrs):
    _check_inputs("Softmax", inputs, 9)
    tables = decode(SoftmaxTables, attrs, list(inputs[1:]))
    return int_softmax(inputs[0], int(attrs["axis"]), tables)


def _layernorm_encode(tables: LayerNormTables):
    return _split(tables)


def _layernorm_evaluate(inputs, attrs):
    _check_inputs("LayerNorm", inputs, 7)
    return int_layernorm(inputs[0], decode(LayerNormTables, attrs, list(inputs[1:])))


def _quantize_encode(scale, *, axis: int = 1, dtype: str = "int8", rounding: str = "bpu_round"):
    fp.qrange(dtype)
    fp.round_by(0.0, rounding)  # validate the mode now, not at evaluation
    attrs = {"axis": int(axis), "dtype": dtype, "rounding": rounding}
    return attrs, {"scale": np.atleast_1d(np.asarray(scale))}


def _quantize_evaluate(inputs, attrs):
    """FORMULA: ``clamp(round_by(x / scale), qrange(dtype))`` via fixedpoint.quantize."""
    _check_inputs("QuantizeLinear", inputs, 2)
    x, scale = np.asarray(inputs[0]), np.asarray(inputs[1])
    ch_axis = None if scale.size == 1 else int(attrs["axis"])
    q = fp.quantize(x, scale.reshape(-1), attrs["dtype"], attrs["rounding"], ch_axis)
    return q.astype(_NP_DTYPES[attrs["dtype"]])


CUSTOM_OPS: dict[str, CustomOp] = {
    "Lut": CustomOp(_lut_encode, _lut_evaluate),
    "Softmax": CustomOp(_softmax_encode, _softmax_evaluate),
    "LayerNorm": CustomOp(_layernorm_encode, _layernorm_evaluate),
    "QuantizeLinear": CustomOp(_quantize_encode, _quantize_evaluate),
    **{name: CustomOp(encode, evaluate) for name, evaluate in INT_OPS.items()},
}
"""Op type (in :data:`DOMAIN`) -> encoder/evaluator."""
