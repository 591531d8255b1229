"""Resident memory given back to the system between the large steps of a run.

Four things keep a run's resident set at the high-water mark of every step before:

- **Freed heap.** glibc's malloc serves a block from its heap unless the block is larger
  than the mmap threshold, and it raises that threshold to the size of any mapped block
  freed (up to 32 MB on 64-bit). So once the first large tensor is freed, a 224x224
  model's layer tensors (1-13 MB each) all come from the heap, and when they are freed
  their pages stay resident wherever a live block sits above them (glibc gives back only
  the top of a heap on its own). ResNet-50@224, 100 frames: 1.0 GB after the dataset,
  2.9 GB by the last stage, 6 GB in the analysis, most of it free heap.
- **The evaluation frames.** 1000 frames of 3x224x224 float32 are 0.6 GB, read a batch
  at a time. :func:`file_backed` moves a large array into a shared mapping of an unlinked
  file (its pages are the kernel's page cache: written back to the file, reclaimable,
  read again on the next touch), and only the pages touched since the last
  :func:`drop_mapped` count as the process's own.
- **Garbage cycles.** A traced graph, a GraphModule and their weights sit in reference
  cycles, which only the cycle collector frees, and its full pass seldom runs among a
  run's many long-lived objects: ResNet-50@224's stages left 1.1 GB of them at the
  analysis's start (2.10 GB resident, 0.99 GB after ``gc.collect()`` and a trim).
- **Per-thread arenas.** glibc gives each thread that allocates its own arena (up to 8 per
  core), and a free block of one arena serves none of the others: the comparison's metric
  threads, Prefect's task threads and the simulator's workers each kept their own high
  water. :func:`tune_malloc` caps them at :data:`ARENAS` before a run starts threads.

:func:`tune_malloc` also keeps large blocks in the heap. glibc maps every block past its
mmap threshold (at most 32 MB when left dynamic) and unmaps it on free, and shrinks the
heap's top past its trim threshold, so each such block's pages are faulted in and zeroed
by the kernel again on the next allocation. A 224x224 model's batch of 16 holds such
blocks (ResNet-50's first maps: 51 MB): float ResNet-50, 4 batches of 16, spent 4.1-5.2 s
of system time in 1.1-1.4 M page faults beside 12.5-17 s of user time, 8.4-11.5 s wall;
with both thresholds at :data:`KEEP_BYTES`, 0.01 s and no fault, 5.6-6.9 s wall. What
the heap then holds free is given back by :func:`settle` and :func:`release`.

:func:`release` does the first two: :func:`drop_mapped`, and glibc's ``malloc_trim(0)``
(returns every whole free page of every arena: ~50 ms for 600 MB of holes) once the heaps
hold more than :data:`FREE_HEAP_BYTES` free (1 GB) (``mallinfo2``, ~40 us); with another C
library nothing. :func:`settle` collects the cycles, then trims whatever is free: between
the large steps (a stage's end, the analysis's phases), where what a step freed serves
nothing that follows. Values never change: a dropped page is read back from the file, and
writes to a mapped array go to the file.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import mmap
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np

_MAPPED: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


FREE_HEAP_BYTES = 2**30
""":func:`release` trims only when the heaps hold more than this free: every trimmed page
is faulted in again when malloc reuses it. Trimming before every model run of a
MobileNetV2@224 analysis (399 calls) cost 6x the page faults and 30% more CPU for a 0.26
GB lower peak, and at 256 MB 384 of the 399 calls still trimmed (bench/README.md,
"Resident memory given back"): at 1 GB a trim comes only after a large free."""


SETTLE_BYTES = 32 * 2**20
""":func:`settle` trims when more than this is free: a few calls a stage or analysis phase,
so every trim is worth its faults. ResNet-50@224, 100 frames: the stages left 1.0 GB free
in the heap at the analysis's start (under :data:`FREE_HEAP_BYTES`), 2.46 GB resident."""

COLLECT_SHARE = 0.03
""":func:`settle`'s largest share of a run's time in garbage collections."""
_COLLECTED = {"end": float("-inf"), "cost": 0.0}
"""When :func:`settle`'s last collection ended and what it cost (perf_counter seconds)."""

ARENAS = 1
""":func:`tune_malloc`'s arena cap: every thread allocates from the main arena (numpy's and the
runtimes' allocations are few and large, so the lock is rarely contended). ResNet-50@224's
analysis alone, 100 frames: the comparison at 2.3-2.5 GB resident instead of 2.7-2.8."""
KEEP_BYTES = 2**30
""":func:`tune_malloc`'s mmap and trim thresholds: blocks up to this size come from the heap
and stay there when freed, and the heap's free top is kept up to this size."""
M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -8, -3, -1
"""glibc's ``mallopt`` parameter numbers (malloc.h)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _glibc():
    """(``malloc_trim``, ``mallinfo2``, ``mallopt``) from the process's own symbols, or
    None (not glibc, or older than 2.33)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        return libc.malloc_trim, libc.mallinfo2, libc.mallopt
    except (OSError, AttributeError):
        return None


def tune_malloc(arenas: int = ARENAS, keep: int = KEEP_BYTES) -> bool:
    """Before a run starts threads: cap glibc's arenas at ``arenas`` (threads started later
    share them instead of each growing its own), and keep blocks of up to ``keep`` bytes
    and a free top of up to ``keep`` in the heap (module docstring). True if all three
    were set (glibc). The trim threshold is set only once the mmap threshold is: setting
    either turns off glibc's dynamic mmap threshold, and the trim threshold alone would
    then map every block past 128 KB."""
    fns = _glibc()
    if fns is None:
        return False
    mallopt = fns[2]
    if not mallopt(M_ARENA_MAX, arenas) or not mallopt(M_MMAP_THRESHOLD, keep):
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, keep))


def settle() -> bool:
    """Between the large steps of a run: collect the garbage cycles (a traced graph, a
    GraphModule and its weights free only through the cycle collector, which seldom runs
    a full pass in a process of long-lived objects), then :func:`release` everything
    free past :data:`SETTLE_BYTES`. True if ``malloc_trim`` ran.

    A full collection costs ~0.3 s among a run's imports, so one runs only once
    ``cost / COLLECT_SHARE`` seconds have passed since the last one ended: at most
    :data:`COLLECT_SHARE` of the time. A real model's steps take tens of seconds and get
    one each; the seconds-long steps of a small model share one."""
    start = time.perf_counter()
    if start - _COLLECTED["end"] >= _COLLECTED["cost"] / COLLECT_SHARE:
        gc.collect()
        end = time.perf_counter()
        _COLLECTED.update(end=end, cost=end - start)
    return release(at_least=SETTLE_BYTES)


def free_heap_bytes() -> int:
    """Bytes malloc holds free in its heaps (``mallinfo2().fordblks``; 0 if unknown)."""
    fns = _glibc()
    return int(fns[1]().fordblks) if fns else 0


def release(at_least: int | None = None) -> bool:
    """Drop the mapped arrays' pages, and give the heaps' free pages back to the system
    when they hold more than ``at_least`` bytes free (default :data:`FREE_HEAP_BYTES`);
    True if ``malloc_trim`` ran."""
    drop_mapped()
    fns = _glibc()
    limit = FREE_HEAP_BYTES if at_least is None else at_least
    if fns is None or free_heap_bytes() <= limit:
        return False
    fns[0](0)
    return True


def file_backed(a: np.ndarray, folder: str | Path | None = None) -> np.ndarray:
    """A writable copy of ``a`` in a shared mapping of an unlinked file in ``folder``
    (default: the system's temporary folder; the file is gone when the array is)."""
    if a.nbytes == 0:
        return a.copy()
    with tempfile.TemporaryFile(dir=folder) as fh:
        fh.write(memoryview(np.ascontiguousarray(a)).cast("B"))
        fh.flush()
        mm = mmap.mmap(fh.fileno(), a.nbytes)  # shared, read and write; keeps its own fd
    _MAPPED.add(mm)
    return np.frombuffer(mm, dtype=a.dtype).reshape(a.shape)


def drop_mapped() -> None:
    """Unmap the resident pages of every :func:`file_backed` array (they stay in the page
    cache and the file, and are read back on the next touch)."""
    for mm in list(_MAPPED):
        mm.madvise(mmap.MADV_DONTNEED)


def is_file_backed(a: np.ndarray) -> bool:
    """True if ``a`` is (a view of) a :func:`file_backed` array."""
    while isinstance(a, np.ndarray):
        a = a.base
    owner = a.obj if isinstance(a, memoryview) else a  # np.frombuffer's base
    return isinstance(owner, mmap.mmap) and owner in _MAPPED
