"""LAYERNORM and SOFTMAX through the compiled kernels (simulator/csrc/qnorm.c).

:func:`layernorm` is :func:`simulator.kernels.exec_dense.int_layernorm` in one pass per row: the
same float64 operations on the same exact values (the bounds and their proofs are in
that function's docstrings, rows of ``n < 2**10``), the dense rsqrt table and
:func:`~simulator.kernels.exec_dense.ln_affine`'s per-channel factors. It returns None when it does
not apply (no compiled library, long rows, an input dtype or table it does not take) or
when the data break the runtime bound ``max|y| <= y_top``; the caller then runs the torch
path, which makes the same check and falls back to :func:`simulator.arith.composite.int_layernorm`.

:func:`softmax` is :func:`simulator.kernels.exec_dense.int_softmax` along the last axis, one row
per pass, in the same float operations (its exactness argument holds unchanged).
"""

from __future__ import annotations

import torch

from simulator.arith import fixedpoint as fp
from simulator.arith.composite import NORM_FRAC, VAR_GUARD, LayerNormTables, SoftmaxTables
from simulator.kernels.exec_dense import LN_ROWS_MAX, Dense
from simulator.kernels.exec_kernels import TORCH_DTYPES
from simulator.kernels.exec_native import IN_DTYPES
from simulator.kernels.exec_native_rows import OUT_NAMES
from simulator.runtime import native


def layernorm(q: torch.Tensor, t: LayerNormTables, rsqrt: Dense, affine: tuple):
    """FORMULA (as int_layernorm): ``mean = round(sum(q) 2^s / n)``, ``v = round((X2 -
    2 X1 mean + n mean^2) 2^9 / n) + eps``, ``c = rsqrt[vn] 2^(16 - 17 - k)``, ``y =
    round(q c 2^s - mean c)``, ``out = clamp(round(y w M + b M))``; or None."""
    wm, bm, y_top = affine
    lib = native.library()
    if lib is None or t.n >= LN_ROWS_MAX or q.dtype not in IN_DTYPES:
        return None
    if not q.numel() or q.shape[-1] != t.n or t.out_dtype not in OUT_NAMES or y_top < 0:
        return None
    ok_table = rsqrt.values.dtype == torch.float64 and rsqrt.qmin <= 0 and rsqrt.qmax >= 32767
    if not ok_table or t.rounding not in fp.ROUNDING_MODES:
        return None
    q = q.contiguous()
    out = native.empty(q.shape, dtype=TORCH_DTYPES[t.out_dtype])
    lo, hi = fp.qrange(t.out_dtype)
    wm, bm = wm.contiguous(), bm.contiguous()
    bad = lib.qp_layernorm(native.ptr(q), native.code(q), q.numel() // t.n, t.n,
                           t.in_shift, VAR_GUARD, float(t.eps_fx),
                           int(t.rounding == "half_even"), native.ptr(rsqrt.values), rsqrt.qmin,
                           NORM_FRAC, native.ptr(wm), native.ptr(bm), float(y_top), float(lo),
                           float(hi), native.ptr(out), native.code(out))  # fmt: skip
    return None if bad else out


def softmax(q: torch.Tensor, axis: int, t: SoftmaxTables, exp: Dense, recip: Dense):
    """FORMULA (as exec_dense.int_softmax): ``e = exp[max(q) - q]``, ``r_in = min(round(
    sum(e) 2^-sum_shift), 32767)``, ``y = clamp(round(e * (recip[r_in] * out_mult *
    2^-out_shift)))``; or None: no library, not the last axis, a dtype or table it does not
    take."""
    lib = native.library()
    if lib is None or q.dtype not in IN_DTYPES or not q.numel() or axis % q.ndim != q.ndim - 1:
        return None
    info = torch.iinfo(q.dtype)
    ok = exp.values.dtype == torch.float32 and exp.qmin == 0 and exp.qmax >= info.max - info.min
    ok = ok and recip.values.dtype == torch.float64 and recip.qmin <= 0 and recip.qmax >= 32767
    if not ok or t.out_dtype not in OUT_NAMES or t.rounding not in fp.ROUNDING_MODES:
        return None
    q, n = q.contiguous(), q.shape[-1]
    out = native.empty(q.shape, dtype=TORCH_DTYPES[t.out_dtype])
    lo, hi = fp.qrange(t.out_dtype)
    lib.qp_softmax(native.ptr(q), native.code(q), q.numel() // n, n, native.ptr(exp.values),
                   native.ptr(recip.values), recip.qmin, 2.0**-t.sum_shift,
                   t.out_mult * 2.0**-t.out_shift, int(t.rounding == "half_even"), float(lo),
                   float(hi), native.ptr(out), native.code(out))  # fmt: skip
    return out
