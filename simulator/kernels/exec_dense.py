"""Dense tables: a table op evaluated with one gather instead of its segment arithmetic.

A :class:`~simulator.arith.lut.LutTable` takes an int8 or int16 input and first saturates it to
that range, so its whole behaviour is the ``2**8`` or ``2**16`` values
``dense[i] = lookup(table, qmin + i)``. Computing them once per program (``lookup`` itself
on every input integer) and then indexing ``dense[q - qmin]`` is exact by construction.

:func:`int_softmax` and :func:`int_layernorm` are :func:`simulator.arith.composite.int_softmax` /
:func:`simulator.arith.composite.int_layernorm` with their table lookups made dense and the
elementwise and per-row steps done in float (the exactness bounds are in their
docstrings); rows too long for those bounds keep the int64 steps of
:mod:`simulator.arith.composite`. Formulas and scales are in that module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simulator.arith import composite
from simulator.arith import fixedpoint as fp
from simulator.arith.composite import (
    NORM_FRAC,
    VAR_GUARD,
    LayerNormTables,
    SoftmaxTables,
    _shift_round,
)
from simulator.arith.intmath import round_div
from simulator.arith.lut import LutTable, lookup
from simulator.kernels import exec_native_rows
from simulator.kernels.exec_epilogue import dtype_bound, pow2, round_, round_quotient
from simulator.kernels.exec_kernels import FLOAT32_EXACT, FLOAT_EXACT, exact_limit


@dataclass(frozen=True, eq=False)
class Dense:
    """``values[i] = lookup(table, qmin + i)`` for every input integer of the table."""

    values: torch.Tensor
    qmin: int
    qmax: int

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        """FORMULA: ``values[clamp(q, qmin, qmax) - qmin]`` (one gather; int32 indices are
        about 3x faster than int64 advanced indexing)."""
        fast = exec_native_rows.gather(self.values, self.qmin, self.qmax, q)
        if fast is not None:
            return fast  # the same gather in one compiled pass
        info = torch.finfo(q.dtype) if q.is_floating_point() else torch.iinfo(q.dtype)
        if info.min < self.qmin or info.max > self.qmax:
            q = q.clamp(self.qmin, self.qmax)  # a wider input saturates, as lookup does
        return self.gather(q)

    def gather(self, q: torch.Tensor) -> torch.Tensor:
        """``values[q - qmin]`` for ``q`` already inside ``[qmin, qmax]`` (no saturation)."""
        idx = q.to(torch.int32, copy=True).sub_(self.qmin)
        return self.values.index_select(0, idx.reshape(-1)).view(q.shape)


def dense(table: LutTable, dtype: torch.dtype = torch.int64) -> Dense:
    """The :class:`Dense` form of ``table``, values cast to ``dtype`` (exact: every entry
    is an integer of the table's output dtype)."""
    qmin, qmax = fp.qrange(table.in_dtype)
    values = lookup(table, torch.arange(qmin, qmax + 1, dtype=torch.int64))
    return Dense(values.to(dtype).contiguous(), qmin, qmax)


def exp_of_gap(t: SoftmaxTables, in_dtype: torch.dtype) -> Dense:
    """The softmax exp table indexed by the gap ``g = max(q) - q >= 0`` (float32).

    FORMULA: ``values[g] = lookup(exp, clamp(-g, exp.bounds[0], 0))`` for every gap an
    input of ``in_dtype`` can have (``0 .. qmax - qmin``): the clamp of
    :func:`composite.int_softmax` folded into the table. Entries are below 2^15: exact in
    float32. Inputs wider than 16 bits get a table up to ``-exp.bounds[0]`` and their gaps
    are clamped to it by the caller.
    """
    info = torch.iinfo(in_dtype)
    top = info.max - info.min if info.bits <= 16 else -int(t.exp.bounds[0])
    gaps = torch.arange(0, top + 1, dtype=torch.int64)
    values = lookup(t.exp, (-gaps).clamp_(int(t.exp.bounds[0]), 0))
    return Dense(values.to(torch.float32).contiguous(), 0, top)


def int_softmax(q: torch.Tensor, axis: int, t: SoftmaxTables, exp: Dense, recip: Dense):
    """:func:`simulator.arith.composite.int_softmax` with the gap-indexed ``exp``
    (:func:`exp_of_gap`) and a dense ``recip`` (float64).

    FORMULA: ``g = max(q) - q`` (int32; int64 and clamped for wider q); ``e = exp[g]``;
    ``s = sum(e)``; ``r = recip(min(round(s 2^-sum_shift), 32767))``;
    ``out = clamp(round(e * (r * out_mult * 2^-out_shift)))``. Exact: ``e < 2^15`` (a
    float32 integer; ``s`` sums in float32 while ``n 2^15 < 2^24``, else float64),
    ``r * out_mult < 2^30`` and ``e * r * out_mult < 2^45``, so every float64 product is
    an exact power-of-two scaling of an integer below 2^52 (:func:`round_`).
    """
    narrow = torch.iinfo(q.dtype).bits <= 16  # gaps fit int32 and the table covers them
    top = q.amax(dim=axis, keepdim=True)
    gap = torch.sub(top.int(), q.int()) if narrow else torch.sub(top.long(), q.long())
    gap = gap if narrow else gap.clamp_(0, exp.qmax)
    e = exp.values.index_select(0, gap.reshape(-1)).view(q.shape)  # gap keeps q's strides
    wide = q.shape[axis] * 2**15 >= FLOAT32_EXACT
    s = e.sum(dim=axis, keepdim=True, dtype=torch.float64 if wide else None).double()
    r_in = round_(s.mul_(2.0**-t.sum_shift), t.rounding).clamp_(max=32767)
    rc = recip.gather(r_in).mul_(t.out_mult * 2.0**-t.out_shift)  # 0 <= r_in <= 32767
    y = round_(e.to(torch.float64).mul_(rc), t.rounding)
    return y.clamp_(*fp.qrange(t.out_dtype))


def _normalize_var(v: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`simulator.arith.composite._normalize_var` with ``bit_length(v)`` read from the
    float64 exponent (``v = m 2^e``, ``0.5 <= m < 1``: ``e`` is the bit length of an
    integer ``0 <= v < 2^53``; here ``v < 2^42``) instead of 63 comparisons per row.

    FORMULA: ``k = (bit_length(v) - 14) // 2``, ``vn = clamp(round(v * 4^-k), 0, 32767)``.
    """
    if v.numel() and int(v.max()) >= FLOAT_EXACT:
        return composite._normalize_var(v, mode)
    k = (torch.frexp(v.double()).exponent.long() - 14).div_(2, rounding_mode="floor")
    return _shift_round(v, 2 * k, mode).clamp_(0, 32767), k


def _row_stats(q: torch.Tensor, t: LayerNormTables):
    """Per row: ``q`` as float64, ``mean`` and ``v`` of :func:`composite.int_layernorm`
    (float64 integers), from two reductions instead of materializing ``d`` and ``d^2``.

    FORMULA: ``X1 = sum(q) 2^s``, ``X2 = sum(q^2) 4^s`` (``s = in_shift``, ``|x| <= 2^15``),
    ``mean = round_div(X1, n)``, ``sum(d^2) = X2 - 2 mean X1 + n mean^2`` (the identity
    ``sum((x - m)^2) = sum(x^2) - 2 m sum(x) + n m^2``), ``v = round_div(sum(d^2) 2^9, n)
    + eps_fx``. Exact in float64 for ``n < 2^10`` (:data:`LN_ROWS_MAX`): every sum and
    term is an integer below ``2^50`` (``X2 <= n 2^30``, ``|2 mean X1| <= n 2^31``; about
    the rounded mean ``sum(d^2) <= n (2^30 + 1/4)``, half the int16 range squared, so
    ``sum(d^2) 2^9 < 2^50``), and the divisions go through :func:`round_quotient`. The
    sums of ``q`` and ``q^2`` run in float32 when ``n max|q|^2 < 2^24`` (int8 rows shorter
    than 1024: exact integers in any order).
    """
    q32 = n_sq(q, t.n) < FLOAT32_EXACT
    qs = q.float() if q32 else q.to(torch.float64)
    x1 = qs.sum(-1, keepdim=True).double().mul_(2.0**t.in_shift)  # one dtype per op
    qf = q.to(torch.float64) if q32 else qs
    x2 = (qs.square_() if q32 else qs.square()).sum(-1, keepdim=True).double()
    mean = round_quotient(x1, t.n, t.rounding)
    ssd = x2.mul_(4.0**t.in_shift).sub_(x1.mul_(mean).mul_(2.0)).add_(mean * mean * t.n)
    return qf, mean, round_quotient(ssd.mul_(2.0**VAR_GUARD), t.n, t.rounding).add_(t.eps_fx)


def n_sq(q: torch.Tensor, n: int) -> int:
    """``n * max|q|^2`` over q's dtype: the bound of a row's sum of squares."""
    return n * dtype_bound(q.dtype) ** 2


LN_ROWS_MAX = 2**10
"""LayerNorm rows shorter than this run :func:`_row_stats` (float64-exact); longer ones the
int64 steps of :mod:`simulator.arith.composite`."""


def _row_scale(v: torch.Tensor, mode: str, rsqrt: Dense) -> torch.Tensor:
    """``c = rsqrt(vn) * 2^(16 - 17 - k)`` per row, with ``vn, k`` of
    :func:`composite._normalize_var` done in float64 (``v < 2^50``).

    FORMULA: ``k = (e - 14) // 2`` with ``e`` the frexp exponent (the bit length of the
    integer ``v``); ``vn = clamp(round(v 4^-k), 0, 32767)`` (a power-of-two scaling: exact,
    then rounded in the table's mode).
    """
    k = torch.frexp(v).exponent.sub_(14).bitwise_right_shift_(1)
    vn = round_(v.mul_(pow2(-2 * k)), mode).clamp_(0, 32767)
    return rsqrt.gather(vn).mul_(pow2(NORM_FRAC - 17 - k))


def int_layernorm(q: torch.Tensor, t: LayerNormTables, rsqrt: Dense,
                  affine: tuple | None = None) -> torch.Tensor | None:  # fmt: skip
    """:func:`simulator.arith.composite.int_layernorm` with float64 row statistics, a dense
    ``rsqrt`` and fused elementwise passes, or None when a runtime bound fails (the caller
    then runs the composite reference).

    FORMULA (as composite): ``x = q * 2^in_shift``; ``d = x - mean``; ``c`` of
    :func:`_row_scale`; ``y = round(q (c 2^in_shift) - mean c) = round(d * rsqrt(vn) *
    2^(16 - 17 - k))``; ``out = clamp(round(y (w M) + b M))`` with ``M = out_mult
    2^-out_shift``, i.e. ``round((y w + b) out_mult 2^-out_shift)``. Exact in float64:
    ``|x|, |mean| <= 2^15`` and ``|d rsqrt| < 2^31``, so both products and their
    difference are power-of-two scalings of integers below 2^52; then ``(max|y| max|w| +
    max|b|) out_mult < exact_limit`` is checked on the data, which makes ``y w M``,
    ``b M`` and their sum exact. ``affine``: :func:`ln_affine` of ``t``, when the caller
    keeps it.
    """
    affine = ln_affine(t) if affine is None else affine
    if t.n >= LN_ROWS_MAX:
        return _int_layernorm_long(q, t, rsqrt, affine)
    mode = t.rounding
    qf, mean, v = _row_stats(q, t)
    c = _row_scale(v, mode, rsqrt)
    y = round_(qf.mul_(c.mul(2.0**t.in_shift)).sub_(mean.mul_(c)), mode)  # in place: faster
    return _affine_out(y, t, affine)


def ln_affine(t: LayerNormTables) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(weight_q M, bias_q M, max|w| max|y| + max|b| limit)`` of :func:`_affine_out`:
    float64 per-channel factors (exact: 30-bit integers times ``M = out_mult 2^-out_shift``)
    and the largest ``max|y|`` that keeps ``(max|y| max|w| + max|b|) out_mult`` below
    :func:`exact_limit` (2^53 half_even, 2^52 bpu_round)."""
    m = t.out_mult * 2.0**-t.out_shift
    wm, bm = (torch.from_numpy(a).double().mul_(m) for a in (t.weight_q, t.bias_q))
    w_top, b_top = int(abs(t.weight_q).max()), int(abs(t.bias_q).max())
    room = exact_limit(t.rounding) // max(t.out_mult, 1) - b_top  # max|y| w_top < room
    return wm, bm, (room - 1) // max(w_top, 1) if room > 0 else -1


def _affine_out(y: torch.Tensor, t: LayerNormTables, affine: tuple) -> torch.Tensor | None:
    """``clamp(round((y * weight_q + bias_q) * out_mult * 2^-out_shift))`` in float64 when
    ``max|y|`` is within the limit of :func:`ln_affine` (checked here), else None."""
    wm, bm, y_top = affine
    lo, hi = torch.aminmax(y)
    if max(-int(lo), int(hi)) > y_top:
        return None
    return round_(y.mul_(wm).add_(bm), t.rounding).clamp_(*fp.qrange(t.out_dtype))


def _int_layernorm_long(q: torch.Tensor, t: LayerNormTables, rsqrt: Dense, affine: tuple):
    """Rows of ``n >= 2^10``: int64 mean and variance as composite, float64 after."""
    mode = t.rounding
    x = q.double().mul_(2.0**t.in_shift)
    d = x.sub_(round_div(x.sum(-1, keepdim=True).long(), t.n, mode))
    v = round_div(d.square().sum(-1, keepdim=True).long() << VAR_GUARD, t.n, mode) + t.eps_fx
    vn, k = _normalize_var(v, mode)
    y = round_(d.mul_(rsqrt(vn)).mul_(torch.pow(2.0, NORM_FRAC - 17 - k.double())), mode)
    return _affine_out(y, t, affine)
