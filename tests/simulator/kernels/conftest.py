"""The compiled kernels' tests run twice: on one thread, and on three (simulator/csrc/qpool.c:
the calling thread and two workers claim a loop's chunks; more threads than this machine's
cores) with every loop split into chunks of about 64 elements of work, so a chunk run twice
or never, a seam between chunks, or a flag (QUANTIZE's, LayerNorm's) lost between threads
fails the same comparisons with the reference."""

from __future__ import annotations

import pytest

from simulator.runtime import native, threads


@pytest.fixture(scope="module", params=[1, 3], ids=["1 thread", "3 threads"])
def pool_threads(request):
    lib = native.library()
    if lib is None or request.param == 1:
        yield request.param
        return
    lib.qp_pool_sizes(1, 64)
    try:
        with threads.kernel_threads(lib, request.param):
            yield request.param
    finally:
        lib.qp_pool_sizes(0, 0)
