"""The executor's requantize (float64 fast path and int64 path) against the reference."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import exec_kernels as ek
from simulator import intmath


@settings(max_examples=200, deadline=None)
@given(
    acc=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=40),
    mult=st.integers(1, 2**15 - 1),
    shift=st.integers(0, 40),
    mode=st.sampled_from(["half_even", "bpu_round"]),
    ties=st.booleans(),
)
def test_requant_equals_reference_including_ties(acc, mult, shift, mode, ties):
    a = np.array(acc, dtype=np.int64)
    if ties and shift > 0:  # make acc * mult land exactly on k + 0.5 steps
        mult = 1
        a = (a >> shift << shift) + (1 << (shift - 1))
    want = intmath.requantize(a, mult, shift, "int16", mode)
    got = ek.requant(
        torch.from_numpy(a), torch.tensor([mult]), torch.tensor([shift]), "int16", mode, None
    )
    assert got.tolist() == np.asarray(want).tolist()
    assert int(np.abs(a).max()) * mult < ek.FLOAT_EXACT  # the float64 path was taken
