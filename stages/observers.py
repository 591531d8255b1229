"""Observers: collect statistics of a tensor; :meth:`amax` reduces them to one magnitude.

An observer never computes a scale. The fake-quant module turns ``amax()`` into a scale
with :func:`simulator.arith.fixedpoint.symmetric_scale` (and ``pot_scale``), so the formula lives
in one place. Every observer's ``forward(x)`` records and returns ``x`` unchanged.

``amax()`` has shape [1] per tensor, or [C] per channel along ``ch_axis`` (minmax only:
the vendor observes weights per output channel with minmax, activations per tensor).
"""

from __future__ import annotations

import torch
from torch import nn

from schemas.errors import StageError
from simulator.arith import fixedpoint

SAMPLE_CAP = 2**20
"""Most values a sampling observer keeps, however many batches it sees."""
SAMPLE_SEED = 20240601
"""Seed of the subsampling generator: two runs over the same data keep the same sample."""
MSE_GRID = torch.linspace(0.3, 1.0, 100, dtype=torch.float64)
"""Fractions of max|x| the MSE observer tries as amax."""


def _check_finite(x: torch.Tensor) -> None:
    if not bool(torch.isfinite(x).all()):
        raise StageError(
            "observer saw NaN/Inf",
            where="calibration",
            hint="check the input data and the float model's outputs for NaN/Inf",
        )


class _Observer(nn.Module):
    """Shared plumbing: NaN check, no autograd, ``forward`` returns x unchanged."""

    ch_axis: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            data = x.detach().float()
            _check_finite(data)
            if data.numel():
                self._observe(data)
        return x

    def _observe(self, x: torch.Tensor) -> None:
        raise NotImplementedError

    @property
    def has_data(self) -> bool:
        raise NotImplementedError

    def amax(self) -> torch.Tensor:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class MinMaxObserver(_Observer):
    """Running min and max, per tensor or per channel along ``ch_axis``.

    FORMULA: ``min = min(min, min(x))``, ``max = max(max, max(x))``,
    ``amax = max(|min|, |max|)``. Buffers ``min_val``/``max_val`` are persisted; they are
    empty until the first batch (and resized when a state_dict is loaded).
    """

    def __init__(self, ch_axis: int | None = None):
        super().__init__()
        self.ch_axis = ch_axis
        self.register_buffer("min_val", torch.empty(0))
        self.register_buffer("max_val", torch.empty(0))

    def _batch_minmax(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ch_axis is None:
            return x.min().reshape(1), x.max().reshape(1)
        flat = x.movedim(self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)
        return flat.min(dim=1).values, flat.max(dim=1).values

    def _observe(self, x: torch.Tensor) -> None:
        lo, hi = self._batch_minmax(x)
        if self.has_data:
            lo, hi = torch.minimum(self.min_val, lo), torch.maximum(self.max_val, hi)
        self._store(lo, hi)

    def _store(self, lo: torch.Tensor, hi: torch.Tensor) -> None:
        self.min_val.resize_(lo.shape).copy_(lo)
        self.max_val.resize_(hi.shape).copy_(hi)

    @property
    def has_data(self) -> bool:
        return self.min_val.numel() > 0

    def amax(self) -> torch.Tensor:
        return torch.maximum(self.min_val.abs(), self.max_val.abs())

    def reset(self) -> None:
        self._store(torch.empty(0), torch.empty(0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("min_val", "max_val"):
            if prefix + name in state_dict:
                getattr(self, name).resize_(state_dict[prefix + name].shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"ch_axis={self.ch_axis}, min_val={self.min_val}, max_val={self.max_val}"


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Exponential moving average of each batch's min and max (per tensor).

    FORMULA: first batch ``min = min(x)``; then ``min += c * (min(x) - min)``, the same for
    max, with ``c = averaging_constant``; ``amax = max(|min|, |max|)``.
    """

    def __init__(self, averaging_constant: float = 0.01):
        super().__init__(ch_axis=None)
        if not 0 < averaging_constant <= 1:
            raise StageError(
                f"averaging_constant {averaging_constant} is not in (0, 1]",
                where="observer moving_average_minmax",
            )
        self.averaging_constant = averaging_constant

    def _observe(self, x: torch.Tensor) -> None:
        lo, hi = self._batch_minmax(x)
        if self.has_data:
            c = self.averaging_constant
            lo = self.min_val + c * (lo - self.min_val)
            hi = self.max_val + c * (hi - self.max_val)
        self._store(lo, hi)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, averaging_constant={self.averaging_constant}"


class _SamplingObserver(_Observer):
    """Keeps a bounded, deterministic sample of the observed values (not persisted).

    Merging a batch of ``b`` values into a sample standing for ``n`` values keeps about
    ``cap * b / (n + b)`` of the batch and the rest of the old sample, each part drawn
    uniformly with a seeded generator: a proportional (stratified) reservoir, so memory
    stays at ``cap`` values and every value seen has about the same chance to be kept.
    ``absmax`` (the exact running max|x|) is a persisted buffer.
    """

    def __init__(self, cap: int = SAMPLE_CAP):
        super().__init__()
        self.cap = cap
        self.sample = torch.empty(0)
        self.n_seen = 0
        self.generator = torch.Generator().manual_seed(SAMPLE_SEED)
        self.register_buffer("absmax", torch.zeros(1))

    def _pick(self, values: torch.Tensor, k: int) -> torch.Tensor:
        if k >= values.numel():
            return values
        return values[torch.randperm(values.numel(), generator=self.generator)[:k]]

    def _observe(self, x: torch.Tensor) -> None:
        batch = x.reshape(-1)
        self.absmax = torch.maximum(self.absmax, batch.abs().max().reshape(1))
        old, b = self.sample, batch.numel()
        total = self.n_seen + b
        if old.numel() + b <= self.cap:
            self.sample = torch.cat([old, batch])
        else:
            k_new = min(b, max(self.cap - old.numel(), round(self.cap * b / total)))
            self.sample = torch.cat([self._pick(old, self.cap - k_new), self._pick(batch, k_new)])
        self.n_seen = total

    @property
    def has_data(self) -> bool:
        return self.sample.numel() > 0

    def reset(self) -> None:
        self.sample, self.n_seen = torch.empty(0), 0
        self.generator.manual_seed(SAMPLE_SEED)
        self.absmax.zero_()


class PercentileObserver(_SamplingObserver):
    """amax = a percentile of |x| over the bounded sample.

    FORMULA: ``amax = percentile(|sample|, p)`` with linear interpolation between order
    statistics (numpy's default), computed in float64.
    """

    def __init__(self, percentile: float = 99.99, cap: int = SAMPLE_CAP):
        super().__init__(cap)
        if not 0 < percentile <= 100:
            raise StageError(f"percentile {percentile} is not in (0, 100]", where="observer")
        self.percentile = percentile

    def amax(self) -> torch.Tensor:
        values = self.sample.abs().double()
        return torch.quantile(values, self.percentile / 100).float().reshape(1)

    def extra_repr(self) -> str:
        return f"percentile={self.percentile}, kept={self.sample.numel()}/{self.n_seen}"


class MSEObserver(_SamplingObserver):
    """amax minimizing the mean squared fake-quant error over the bounded sample.

    FORMULA: ``amax = argmin_{a in A} mean((fq(x, symmetric_scale(a)) - x)^2)`` with
    ``A = max|x| * k`` for 100 values of ``k`` evenly spaced in [0.3, 1.0] and ``fq`` =
    :func:`simulator.arith.fixedpoint.fake_quantize` with the configured dtype and rounding. The
    first (smallest) minimizer wins, so the result is deterministic.
    """

    def __init__(self, dtype: str = "int8", rounding: str = "half_even", cap: int = SAMPLE_CAP):
        super().__init__(cap)
        if dtype not in fixedpoint.QRANGES or rounding not in fixedpoint.ROUNDING_MODES:
            raise StageError(
                f"MSE observer got dtype={dtype!r}, rounding={rounding!r}",
                where="observer mse",
                hint=f"dtype in {tuple(fixedpoint.QRANGES)}, rounding in "
                f"{fixedpoint.ROUNDING_MODES}",
            )
        self.dtype = dtype
        self.rounding = rounding

    def candidates(self) -> torch.Tensor:
        """The amax values tried, in float32 (as the scale will be)."""
        return (self.absmax.double() * MSE_GRID).float()

    def mse(self, amax: torch.Tensor) -> float:
        """Mean squared fake-quant error of the sample at one amax."""
        scale = fixedpoint.symmetric_scale(amax, self.dtype)
        fq = fixedpoint.fake_quantize(self.sample, scale, self.dtype, self.rounding)
        return float((fq - self.sample).double().square().mean())

    def amax(self) -> torch.Tensor:
        cands = self.candidates()
        errors = torch.tensor([self.mse(a) for a in cands])
        return cands[int(torch.argmin(errors))].reshape(1)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, rounding={self.rounding}, kept={self.sample.numel()}"


OBSERVER_KINDS = ("minmax", "moving_average_minmax", "percentile", "mse")


def make_observer(
    kind: str,
    *,
    ch_axis: int | None = None,
    percentile: float = 99.99,
    averaging_constant: float = 0.01,
    dtype: str = "int8",
    rounding: str = "half_even",
) -> _Observer:
    """Build an observer by kind name; per channel (``ch_axis``) only for ``minmax``."""
    if kind not in OBSERVER_KINDS:
        raise StageError(
            f"unknown observer {kind!r}", where="observer", hint=f"use one of {OBSERVER_KINDS}"
        )
    if ch_axis is not None and kind != "minmax":
        raise StageError(
            f"observer {kind!r} is per tensor only, got ch_axis={ch_axis}",
            where="observer",
            hint="observe per-channel weights with 'minmax'",
        )
    if kind == "minmax":
        return MinMaxObserver(ch_axis=ch_axis)
    if kind == "moving_average_minmax":
        return MovingAverageMinMaxObserver(averaging_constant=averaging_constant)
    if kind == "percentile":
        return PercentileObserver(percentile=percentile)
    return MSEObserver(dtype=dtype, rounding=rounding)
