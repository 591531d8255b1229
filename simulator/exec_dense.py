"""Dense tables: a table op evaluated with one gather instead of its segment arithmetic.

A :class:`~simulator.lut.LutTable` takes an int8 or int16 input and first saturates it to
that range, so its whole behaviour is the ``2**8`` or ``2**16`` values
``dense[i] = lookup(table, qmin + i)``. Computing them once per program (``lookup`` itself
on every input integer) and then indexing ``dense[q - qmin]`` is exact by construction.

:func:`int_softmax` and :func:`int_layernorm` are :func:`simulator.composite.int_softmax` /
:func:`simulator.composite.int_layernorm` with their table lookups made dense and the
elementwise steps done in float64, exact below ``2**53`` (the bounds are in their
docstrings); per-row steps reuse :mod:`simulator.composite` itself. Formulas and scales are in that module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simulator import composite
from simulator import fixedpoint as fp
from simulator.composite import NORM_FRAC, VAR_GUARD, LayerNormTables, SoftmaxTables, _shift_round
from simulator.exec_epilogue import FLOAT_EXACT, round_
from simulator.intmath import round_div
from simulator.lut import LutTable, lookup


@dataclass(frozen=True, eq=False)
class Dense:
    """``values[i] = lookup(table, qmin + i)`` for every input integer of the table."""

    values: torch.Tensor
    qmin: int
    qmax: int

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        """FORMULA: ``values[clamp(q, qmin, qmax) - qmin]`` (one gather; int32 indices are
        about 3x faster than int64 advanced indexing)."""
        info = torch.finfo(q.dtype) if q.is_floating_point() else torch.iinfo(q.dtype)
        if info.min < self.qmin or info.max > self.qmax:
            q = q.clamp(self.qmin, self.qmax)  # a wider input saturates, as lookup does
        idx = q.to(torch.int32, copy=True).sub_(self.qmin)
        return self.values.index_select(0, idx.reshape(-1)).view(q.shape)


def dense(table: LutTable, dtype: torch.dtype = torch.int64) -> Dense:
    """The :class:`Dense` form of ``table``, values cast to ``dtype`` (exact: every entry
    is an integer of the table's output dtype)."""
    qmin, qmax = fp.qrange(table.in_dtype)
    values = lookup(table, torch.arange(qmin, qmax + 1, dtype=torch.int64))
    return Dense(values.to(dtype).contiguous(), qmin, qmax)


def int_softmax(q: torch.Tensor, axis: int, t: SoftmaxTables, exp: Dense, recip: Dense):
    """:func:`simulator.composite.int_softmax` with dense ``exp`` / ``recip`` (float64).

    FORMULA: ``d = clamp(q - max(q), exp.bounds[0], 0)``; ``e = exp(d)``; ``s = sum(e)``;
    ``r = recip(min(round_div(s, 2**sum_shift), 32767))``;
    ``out = clamp(round(e * r * out_mult * 2**-out_shift))``. Every float64 value is an
    exact integer or an exact product: ``e, r < 2**15``, ``s < 2**31``,
    ``e * r * out_mult < 2**45 < 2**53``.
    """
    qi = q.int()
    d = (qi - qi.amax(dim=axis, keepdim=True)).clamp_(int(t.exp.bounds[0]), 0)
    e = exp(d)
    s = e.sum(dim=axis, keepdim=True)
    r_in = round_(s * 2.0**-t.sum_shift, t.rounding).clamp_(max=32767)
    r = recip(r_in)
    y = round_(e.mul_(r).mul_(t.out_mult * 2.0**-t.out_shift), t.rounding)
    return y.clamp_(*fp.qrange(t.out_dtype))


def _normalize_var(v: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`simulator.composite._normalize_var` with ``bit_length(v)`` read from the
    float64 exponent (``v = m 2^e``, ``0.5 <= m < 1``: ``e`` is the bit length of an
    integer ``0 <= v < 2^53``; here ``v < 2^42``) instead of 63 comparisons per row.

    FORMULA: ``k = (bit_length(v) - 14) // 2``, ``vn = clamp(round(v * 4^-k), 0, 32767)``.
    """
    if v.numel() and int(v.max()) >= FLOAT_EXACT:
        return composite._normalize_var(v, mode)
    k = (torch.frexp(v.double()).exponent.long() - 14).div_(2, rounding_mode="floor")
    return _shift_round(v, 2 * k, mode).clamp_(0, 32767), k


def int_layernorm(q: torch.Tensor, t: LayerNormTables, rsqrt: Dense) -> torch.Tensor | None:
    """:func:`simulator.composite.int_layernorm` in float64 with a dense ``rsqrt``, or None
    when a runtime bound fails (the caller then runs the composite reference).

    FORMULA (as composite): ``x = q * 2^in_shift``; ``d = x - round_div(sum(x), n)``;
    ``v = round_div(sum(d^2) * 2^9, n) + eps_fx``; ``vn, k = _normalize_var(v)``;
    ``y = round(d * rsqrt(vn) * 2^(16 - 17 - k))``; ``z = y * weight_q + bias_q``;
    ``out = clamp(round(z * out_mult * 2^-out_shift))``. Exact in float64: ``|x| <= 2^15``,
    ``|d| <= 2^16``, ``sum(d^2) <= n 2^32 < 2^52`` (``n < 2^20``), ``|d * rsqrt| < 2^31``;
    then ``(max|y| max|w| + max|b|) * out_mult < 2^53`` is checked on the data. Per-row
    steps (mean, variance, normalization) stay int64 via :mod:`simulator.composite`.
    """
    mode = t.rounding
    x = q.double().mul_(2.0**t.in_shift)
    d = x.sub_(round_div(x.sum(-1, keepdim=True).long(), t.n, mode))
    v = round_div(d.square().sum(-1, keepdim=True).long() << VAR_GUARD, t.n, mode) + t.eps_fx
    vn, k = _normalize_var(v, mode)
    y = round_(d.mul_(rsqrt(vn)).mul_(torch.pow(2.0, NORM_FRAC - 17 - k.double())), mode)
    lo, hi = torch.aminmax(y)
    w_top, b_top = int(abs(t.weight_q).max()), int(abs(t.bias_q).max())
    if (max(-int(lo), int(hi)) * w_top + b_top) * t.out_mult >= FLOAT_EXACT:
        return None
    z = y.mul_(torch.from_numpy(t.weight_q).double()).add_(torch.from_numpy(t.bias_q).double())
    out = round_(z.mul_(t.out_mult * 2.0**-t.out_shift), mode)
    return out.clamp_(*fp.qrange(t.out_dtype))
