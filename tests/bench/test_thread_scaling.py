"""bench/thread_scaling.py's helpers: the thread counts it alternates, and its sums."""

import os

import pytest

from bench.thread_scaling import instructions, kind_rows, lost, time_blocks


@pytest.mark.parametrize("before", [None, "3"])
def test_blocks_alternate_the_thread_count_and_leave_the_environment_as_it_was(
    before, monkeypatch
):
    if before is None:
        monkeypatch.delenv("QPARITY_THREADS", raising=False)
    else:
        monkeypatch.setenv("QPARITY_THREADS", before)
    seen = []

    def run():
        seen.append(os.environ["QPARITY_THREADS"])

    times = time_blocks(run, lambda: [(0, "conv", 0.002 if seen[-1] == "1" else 0.001)], 2, 2)
    assert seen == (["1"] * 3 + ["2"] * 3) * 2  # an untimed run after each switch
    assert times[1][0] == pytest.approx(0.002) and times[2][0] == pytest.approx(0.001)
    assert os.environ.get("QPARITY_THREADS") == before


def test_lost_is_the_time_beyond_the_ideal_split():
    assert lost(2.0, 1.0) == 0.0
    assert lost(2.0, 1.5) == 0.5
    assert lost(1.0, 1.2) == pytest.approx(0.7)  # slower on two threads than on one


def test_instructions_timed_on_both_counts_are_paired():
    times = {1: {"run": 9.0, 0: 2.0, 1: 4.0, 2: 1.0}, 2: {"run": 5.0, 0: 1.5, 1: 2.0}}
    assert instructions(times) == {0: (2.0, 1.5), 1: (4.0, 2.0)}


def test_kinds_are_ordered_by_what_they_lose():
    rows = kind_rows({"1x1": 4.0, "depthwise": 4.0}, {"1x1": 2.0, "depthwise": 3.0})
    assert rows == [("depthwise", 4.0, 3.0, 1.0), ("1x1", 4.0, 2.0, 0.0)]
