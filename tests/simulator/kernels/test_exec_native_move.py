"""The compiled data-movement kernels (simulator/csrc/qmove.c) against their torch paths:
max-pool windows and strided copies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.kernels import exec_kernels as ek
from simulator.kernels import exec_native_move
from simulator.runtime import native
from tests.simulator.kernels.test_exec_native_rows import DTYPES, _ints

pytestmark = [pytest.mark.skipif(native.library() is None, reason=native.status()),
              pytest.mark.usefixtures("pool_threads")]  # conftest.py: 1 and 3 threads


@settings(max_examples=80, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31))
def test_maxpool_equals_torch_path(data, dtype, seed):
    """NHWC window maxima (any kernel, stride, dilation, padding, channel count across the
    64-byte chunks) equal exec_kernels.max_pool, which pads with the dtype's minimum."""
    rng = np.random.default_rng(seed)
    n, h, w, c = (data.draw(st.integers(1, hi)) for hi in (3, 9, 9, 70))
    kernel = [data.draw(st.integers(1, 3)) for _ in range(2)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(2)]
    dil = [data.draw(st.integers(1, 2)) for _ in range(2)]
    pads = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    x = torch.from_numpy(_ints(rng, (n, h, w, c), dtype))
    extents = [d * (k - 1) + 1 for d, k in zip(dil, kernel, strict=True)]
    if h + pads[0] + pads[2] < extents[0] or w + pads[1] + pads[3] < extents[1]:
        assert exec_native_move.maxpool(x, kernel, strides, pads, dil) is None
        return
    got = exec_native_move.maxpool(x, kernel, strides, pads, dil)
    want = ek.max_pool(x, (1, 2), kernel, strides, pads, dil)
    assert got is not None and got.dtype == want.dtype
    assert torch.equal(got, want)


def test_maxpool_of_a_window_in_padding_is_the_minimum():
    """Dilation 2 over a 1x1 input with padding 1: the one window's taps (-1, 1) both
    miss the pixel, so it holds the dtype's minimum, as the padded torch path."""
    for dtype in (torch.int8, torch.int16):
        x = torch.full((1, 1, 1, 3), 5, dtype=dtype)
        got = exec_native_move.maxpool(x, [2, 2], [1, 1], [1, 1, 1, 1], [2, 2])
        assert torch.equal(got, ek.max_pool(x, (1, 2), [2, 2], [1, 1], [1, 1, 1, 1], [2, 2]))
        assert got[0, 0, 0, 0] == torch.iinfo(dtype).min and got.shape == (1, 1, 1, 3)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=6),
       dtype=st.sampled_from([torch.int8, torch.int16, torch.int32, torch.float32]))  # fmt: skip
def test_contiguous_copies_any_strided_view(data, shape, dtype):
    """Permuted, sliced (steps, offsets) and expanded views of up to 6 axes, every element
    size, short and long last-axis runs: the same tensor as torch's copy."""
    x = (
        torch.arange(math.prod(shape) * 3)
        .reshape(3, *shape)
        .to(dtype)[data.draw(st.integers(0, 2))]
    )
    perm = data.draw(st.permutations(range(len(shape))))
    v = x.permute(*perm)
    axis = data.draw(st.integers(0, v.ndim - 1))
    v = (
        v.narrow(axis, data.draw(st.integers(0, v.shape[axis] - 1)), 1)
        if data.draw(st.booleans())
        else v
    )
    if data.draw(st.booleans()):
        v = v[..., :: data.draw(st.integers(1, 3))]
    got = exec_native_move.contiguous(v)
    assert got.is_contiguous() and got.dtype == dtype and torch.equal(got, v.contiguous())
    e = torch.arange(4, dtype=dtype).reshape(4, 1).expand(4, 70)  # stride 0, a long run
    assert torch.equal(exec_native_move.contiguous(e.t()), e.t().contiguous())


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.int8, torch.int16]),
       seed=st.integers(0, 2**31), nhwc_view=st.booleans())  # fmt: skip
def test_clip_equals_clamp_in_the_layout_it_gets(data, dtype, seed, nhwc_view):
    """Any length across the 64-byte blocks, contiguous or an NCHW view of NHWC memory (a
    grouped conv's output): torch's clamp, values and strides."""
    n, c, h, w = (data.draw(st.integers(1, hi)) for hi in (2, 70, 5, 9))
    info = torch.iinfo(dtype)
    lo = data.draw(st.integers(info.min, info.max))
    hi = data.draw(st.integers(lo, info.max))
    x = torch.from_numpy(np.random.default_rng(seed).integers(info.min, info.max + 1,
                         (n, h, w, c) if nhwc_view else (n, c, h, w))).to(dtype)  # fmt: skip
    x = x.permute(0, 3, 1, 2) if nhwc_view else x
    y = exec_native_move.clip(x, lo, hi)
    assert y is not None
    assert [s for s, d in zip(y.stride(), y.shape, strict=True) if d > 1] == [  # same memory order
        s for s, d in zip(x.stride(), x.shape, strict=True) if d > 1
    ]
    torch.testing.assert_close(y, x.clamp(lo, hi), rtol=0, atol=0)


def test_clip_of_other_strides_keeps_the_torch_path():
    x = torch.arange(24, dtype=torch.int8).reshape(2, 3, 4)
    assert exec_native_move.clip(x.transpose(0, 2), 0, 5) is None
