"""Observers against numpy references: minmax, EMA, percentile, brute-force MSE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from schemas.errors import StageError
from stages import observers as obs


def batches(n: int = 5, shape=(8, 4, 6, 6), seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) * (i + 1) for i in range(n)]


def test_minmax_per_tensor_and_identity():
    o = obs.MinMaxObserver()
    assert not o.has_data
    data = batches()
    for x in data:
        assert o(x) is x
    allv = torch.stack(data).numpy()
    assert o.amax().shape == (1,)
    assert o.amax().item() == np.abs(allv).max()
    assert o.min_val.item() == allv.min() and o.max_val.item() == allv.max()
    o.reset()
    assert not o.has_data


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_minmax_per_channel(axis):
    o = obs.MinMaxObserver(ch_axis=axis)
    data = batches(3)
    for x in data:
        o(x)
    allv = np.concatenate([x.numpy() for x in data], axis=0 if axis != 0 else 1)
    moved = np.moveaxis(allv, axis, 0).reshape(allv.shape[axis], -1)
    np.testing.assert_array_equal(o.amax().numpy(), np.abs(moved).max(axis=1))
    assert o.amax().shape == (allv.shape[axis],)


def test_minmax_state_dict_into_fresh_observer():
    o = obs.MinMaxObserver(ch_axis=0)
    o(torch.randn(5, 3))
    fresh = obs.MinMaxObserver(ch_axis=0)
    fresh.load_state_dict(o.state_dict())
    assert fresh.has_data
    torch.testing.assert_close(fresh.amax(), o.amax(), rtol=0, atol=0)


def test_moving_average_math():
    c = 0.25
    o = obs.MovingAverageMinMaxObserver(averaging_constant=c)
    data = batches(4)
    lo, hi = data[0].min().item(), data[0].max().item()
    for x in data[1:]:
        lo += c * (x.min().item() - lo)
        hi += c * (x.max().item() - hi)
    for x in data:
        o(x)
    assert o.min_val.item() == pytest.approx(lo, rel=1e-6)
    assert o.max_val.item() == pytest.approx(hi, rel=1e-6)
    assert o.amax().item() == pytest.approx(max(abs(lo), abs(hi)), rel=1e-6)


@pytest.mark.parametrize("p", [50.0, 99.0, 99.99, 100.0])
def test_percentile_matches_numpy(p):
    o = obs.PercentileObserver(percentile=p)
    data = batches(3)
    for x in data:
        o(x)
    allv = np.abs(np.concatenate([x.numpy().ravel() for x in data]))
    assert o.amax().item() == pytest.approx(np.percentile(allv.astype(np.float64), p), rel=1e-6)


def brute_force_mse_amax(x: np.ndarray, absmax: np.float32) -> np.float32:
    """The MSE search written out in numpy, int8, half-to-even."""
    best, best_err = None, np.inf
    for k in np.linspace(0.3, 1.0, 100):
        a = np.float32(np.float64(absmax) * k)
        s = max(np.float32(2) * a / np.float32(255), np.float32(2.0**-24))
        fq = np.clip(np.rint(x / s), -128, 127) * s
        err = np.mean((fq.astype(np.float64) - x) ** 2)
        if err < best_err:
            best, best_err = a, err
    return best


def test_mse_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20000, generator=g) ** 3  # heavy tails: clipping pays off
    o = obs.MSEObserver(dtype="int8", rounding="half_even")
    for part in x.split(7000):
        o(part[torch.randperm(part.numel(), generator=g)])
    want = brute_force_mse_amax(x.numpy(), np.float32(x.abs().max()))
    assert o.amax().item() == want
    assert want < 0.95 * x.abs().max().item()
    bpu = obs.MSEObserver(rounding="bpu_round")
    bpu(x)
    assert 0 < bpu.amax().item() <= x.abs().max().item()


def test_sampling_memory_is_bounded_and_deterministic():
    def feed() -> obs.PercentileObserver:
        o = obs.PercentileObserver()
        for i in range(50):
            o(torch.full((100_000,), float(i)))
            assert o.sample.numel() <= obs.SAMPLE_CAP
        return o

    a, b = feed(), feed()
    assert a.n_seen == 5_000_000 and a.sample.numel() == obs.SAMPLE_CAP
    assert torch.equal(a.sample, b.sample)
    counts = torch.bincount(a.sample.long(), minlength=50).double()
    share = counts / counts.sum()
    assert share.min() > 0.5 / 50 and share.max() < 1.5 / 50  # every batch represented


def test_nan_and_inf_are_refused():
    for o in (obs.MinMaxObserver(), obs.PercentileObserver(), obs.MSEObserver()):
        with pytest.raises(StageError, match="NaN/Inf"):
            o(torch.tensor([1.0, float("nan")]))
        with pytest.raises(StageError, match="NaN/Inf"):
            o(torch.tensor([float("inf")]))


def test_make_observer():
    assert isinstance(obs.make_observer("minmax", ch_axis=0), obs.MinMaxObserver)
    ema = obs.make_observer("moving_average_minmax", averaging_constant=0.5)
    assert ema.averaging_constant == 0.5
    assert obs.make_observer("percentile", percentile=99.0).percentile == 99.0
    mse = obs.make_observer("mse", dtype="int16", rounding="bpu_round")
    assert (mse.dtype, mse.rounding) == ("int16", "bpu_round")
    for kind in ("moving_average_minmax", "percentile", "mse"):
        with pytest.raises(StageError, match="per tensor only"):
            obs.make_observer(kind, ch_axis=0)
    with pytest.raises(StageError, match="unknown observer"):
        obs.make_observer("kl")
    with pytest.raises(StageError):
        obs.make_observer("mse", rounding="half_up")
