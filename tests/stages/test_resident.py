"""stages.resident: free heap pages between live blocks go back to the system."""

from __future__ import annotations

import numpy as np
import pytest

from stages import resident

MB = 2**20


def _anon_mb() -> float:
    """This process's anonymous resident memory (the heap's pages), MB."""
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("RssAnon:"))
    return int(line.split()[1]) / 1024


def test_release_returns_the_pages_of_freed_blocks_below_live_ones():
    if resident._glibc() is None:
        pytest.skip("not glibc: release() has nothing to call")
    del_me = np.ones(16 * MB // 8)  # freeing a mapped 16 MB block raises the mmap threshold
    del del_me
    big, live = [], []
    for _ in range(64):  # 2 MB blocks from the heap, each below a small live one
        big.append(np.ones(2 * MB // 8))
        live.append(np.ones(MB // 8))  # too big for any hole already in the heap
    held = _anon_mb()
    del big
    freed = _anon_mb()
    if held - freed > 64:
        pytest.skip("this malloc gave the blocks back on free (mmap threshold fixed)")
    free = resident.free_heap_bytes()
    assert free > 100 * MB
    assert not resident.release(at_least=free + MB)  # less free than that: kept
    assert _anon_mb() > freed - 20
    assert resident.release(at_least=64 * MB)
    assert _anon_mb() < freed - 100, "the 128 MB freed below live blocks stayed resident"
    assert len(live) == 64


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_a_file_backed_array_keeps_its_values_and_writes_across_drops(tmp_path):
    a = np.random.default_rng(0).standard_normal((64, 3, 32, 32)).astype(np.float32)
    m = resident.file_backed(a, tmp_path)
    assert m.dtype == a.dtype and m.shape == a.shape and np.array_equal(m, a)
    m[5, 1] = 7.0  # writable: a write goes to the file, not lost with the page
    resident.drop_mapped()
    assert np.all(m[5, 1] == 7.0) and np.array_equal(m[6:], a[6:])
    assert list(tmp_path.iterdir()) == []  # unlinked: nothing left in the folder


def test_dropping_gives_back_the_pages_a_read_touched(tmp_path):
    m = resident.file_backed(np.ones((128, 2**18), np.float32), tmp_path)  # 128 MB
    for _ in range(3):  # the host may reclaim page cache meanwhile (a clean-clone CI saw
        resident.drop_mapped()  # +62 MB once, under the full suite's load): up to 3 reads
        before = _rss_mb()
        assert float(m.sum()) == 128 * 2**18  # touches every page
        touched = _rss_mb()
        if touched - before > 100:
            break
    else:
        pytest.fail("reading the mapped array did not count as resident (3 reads)")
    resident.drop_mapped()
    assert _rss_mb() < touched - 100, "the touched pages stayed resident after drop_mapped"


def _arenas(capfd) -> int:
    """glibc's arena count, from ``malloc_stats``' report on stderr."""
    import ctypes

    capfd.readouterr()
    ctypes.CDLL(None).malloc_stats()
    return capfd.readouterr().err.count("Arena ")


def test_threads_started_after_tune_malloc_grow_no_arena_of_their_own(capfd):
    import threading

    if resident._glibc() is None:
        pytest.skip("not glibc: no arenas to share")
    assert resident.tune_malloc()
    before = _arenas(capfd)
    gate = threading.Barrier(21)
    held = []

    def allocate():
        held.append(np.ones(64 * 1024))  # a malloc in this thread: its arena is picked
        gate.wait()

    threads = [threading.Thread(target=allocate) for _ in range(20)]
    for t in threads:
        t.start()
    gate.wait()  # all 20 alive at once: without the cap each takes an arena of its own
    for t in threads:
        t.join()
    assert _arenas(capfd) == before
    assert len(held) == 20


_FAULTS_IN_STEADY_RUNS = """
import resource
import torch
from stages import resident
net = torch.nn.Sequential(  # 4 x 64 x 224 x 224 float32 maps: 51 MB, past the largest
    torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 8, 1)
)  # mmap threshold glibc picks by itself
x = torch.randn(4, 3, 224, 224)
def steady_faults():  # the fewest of 4 runs after one: the heap grows in steps, and
    counts = []  # may grow by a whole map once more (12,544 faults seen in the suite)
    with torch.no_grad():
        net(x)
        for _ in range(4):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            net(x)
            counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(counts)
default = steady_faults()  # glibc's own thresholds first: they cannot be set back
assert resident.tune_malloc()
print(default, steady_faults())
"""


def test_after_tune_malloc_a_models_large_maps_are_reused_without_page_faults():
    """Minor page faults of a run of a 2-conv net once the heap has grown (the fewest of
    4 runs), at glibc's defaults and then tuned, in a fresh process: the thresholds are
    process-wide, and once set they cannot go back to glibc's dynamic ones."""
    import subprocess
    import sys
    from pathlib import Path

    if resident._glibc() is None:
        pytest.skip("not glibc: its thresholds are not ours to set")
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS_IN_STEADY_RUNS],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    default, tuned = map(int, done.stdout.split()[-2:])
    assert tuned < 1000, f"{tuned} page faults a run: the large maps were mapped afresh"
    assert default > 10 * tuned + 10_000, f"glibc's defaults faulted only {default} times a run"


def test_settle_trims_what_the_per_run_release_keeps():
    if resident._glibc() is None:
        pytest.skip("not glibc: settle() has nothing to call")
    del_me = np.ones(16 * MB // 8)  # raises the mmap threshold (see the first test)
    del del_me
    big, live = [], []
    for _ in range(32):  # 2 MB blocks from the heap, each below a small live one
        big.append(np.ones(2 * MB // 8))
        live.append(np.ones(MB // 8))
    del big
    freed = _anon_mb()
    if resident.free_heap_bytes() < resident.SETTLE_BYTES:
        pytest.skip("this malloc gave the blocks back on free (mmap threshold fixed)")
    assert not resident.release()  # under FREE_HEAP_BYTES: a model run keeps them
    assert resident.settle()
    assert _anon_mb() < freed - 40, "the 64 MB freed below live blocks stayed resident"
    assert len(live) == 32


def test_settle_frees_what_only_the_cycle_collector_reaches(monkeypatch):
    import gc
    import weakref

    monkeypatch.setitem(resident._COLLECTED, "end", float("-inf"))  # none ran lately

    class Node:  # a graph node and its weights, in a cycle as traced graphs are
        pass

    a, b = Node(), Node()
    a.peer, b.peer = b, a
    a.weights = np.ones(4 * MB // 8)
    alive = weakref.ref(a)
    gc.disable()  # as if the collector's full pass had not come yet
    try:
        del a, b
        assert alive() is not None
        resident.settle()
        assert alive() is None
    finally:
        gc.enable()


def test_settle_collects_at_most_its_share_of_the_time(monkeypatch):
    import gc

    calls = []
    monkeypatch.setattr(gc, "collect", lambda: calls.append(1))
    monkeypatch.setitem(resident._COLLECTED, "end", float("-inf"))
    resident.settle()
    assert len(calls) == 1
    monkeypatch.setitem(resident._COLLECTED, "cost", 1.0)  # a 1 s collection just ended
    resident.settle()  # 33 s must pass first
    assert len(calls) == 1
    monkeypatch.setitem(resident._COLLECTED, "end", resident._COLLECTED["end"] - 40.0)
    resident.settle()
    assert len(calls) == 2
