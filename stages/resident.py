"""Resident memory given back to the system between the large steps of a run.

Two things keep a run's resident set at the high-water mark of every step before:

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

:func:`release` does both: glibc's ``malloc_trim(0)`` (returns every whole free page of
every arena: ~50 ms for 600 MB of holes, ~0.1 ms when there is nothing to give back; with
another C library nothing) and :func:`drop_mapped`. Values never change: a dropped page
is read back from the file, and writes to a mapped array go to the file.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import tempfile
import weakref
from pathlib import Path

import numpy as np

_MAPPED: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` from the process's own symbols, or None (not glibc)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release() -> bool:
    """Give the heap's free pages and the mapped arrays' pages back to the system; True
    if ``malloc_trim`` ran."""
    drop_mapped()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
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
