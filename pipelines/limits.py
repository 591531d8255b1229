"""Per-stage limits of a spec (``limits.stage_seconds``, ``limits.stage_memory_mb``).

A watchdog thread samples the stage's wall time and the process's resident memory growth
since the stage started (``/proc/self/statm``) every ``POLL_S`` seconds. Past a limit it
raises :class:`LimitExceeded` inside the stage's thread (CPython's
``PyThreadState_SetAsyncExc``): the stage stops at its next Python instruction (a long
C call such as one convolution finishes first), is marked failed by the run store, and
nothing it had not finished writing is kept (every write is atomic). Whatever the stage's
own code turns the interruption into (torch.export wraps every exception), the error that
leaves the guard is the limit's.

The interruption is delivered only while the stage's innermost Python frame is outside
torch: torch calls Python back from C++ (``__torch_dispatch__`` while torch.export traces),
and an exception raised there can cross a C++ frame that may not throw, which aborts the
whole process (seen once in CI: a 0.05 s limit landing inside prepare's export). The
watchdog re-checks every ``SAFE_POLL_S`` until the stage is back in its own code.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from schemas.errors import StageError

POLL_S = 0.1
SAFE_POLL_S = 0.005
_PAGE = os.sysconf("SC_PAGE_SIZE")


class LimitExceeded(StageError):
    """A stage ran past the spec's time or memory limit."""

    def __init__(self, what: str = "a stage limit was exceeded", **kw):
        super().__init__(what, **kw)


def rss_mb() -> float:
    """Resident memory of this process, MB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE / 2**20


@contextmanager
def guard(stage: str, seconds: float | None, memory_mb: float | None) -> Iterator[None]:
    """Run the block under the limits (no watchdog when both are None)."""
    if seconds is None and memory_mb is None:
        yield
        return
    target, stop = threading.get_ident(), threading.Event()
    found: list[str] = []
    watchdog = threading.Thread(
        target=_watch, args=(target, stop, found, seconds, memory_mb), daemon=True
    )
    watchdog.start()
    try:
        yield
    except BaseException:
        if found:  # whatever the stage made of the interruption, the limit is the cause
            raise _error(stage, found[0], seconds, memory_mb) from None
        raise
    finally:
        stop.set()
        watchdog.join()
    if found:  # the stage swallowed the interruption and went on: still past its limit
        raise _error(stage, found[0], seconds, memory_mb)


def _watch(target: int, stop: threading.Event, found: list, seconds, memory_mb) -> None:
    t0, m0 = time.monotonic(), rss_mb()
    while not stop.wait(POLL_S):
        elapsed, grown = time.monotonic() - t0, rss_mb() - m0
        if seconds is not None and elapsed > seconds:
            found.append(f"ran {elapsed:.1f} s (limit {seconds:g} s)")
        elif memory_mb is not None and grown > memory_mb:
            found.append(f"grew {grown:.0f} MB of memory (limit {memory_mb:g} MB)")
        if found:
            _interrupt(target, stop)
            return


def _interrupt(target: int, stop: threading.Event) -> None:
    """Raise :class:`LimitExceeded` in thread ``target`` once its innermost frame is not
    torch's (module docstring); give up when the stage ends first (the guard then raises)."""
    while not stop.is_set():
        frame = sys._current_frames().get(target)
        if frame is None:
            return
        if not in_torch(frame.f_code.co_filename):
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(target), ctypes.py_object(LimitExceeded)
            )
            return
        stop.wait(SAFE_POLL_S)


def in_torch(filename: str) -> bool:
    """Whether ``filename`` is part of torch (or of a package under its folder)."""
    torch = sys.modules.get("torch")
    root = os.path.dirname(getattr(torch, "__file__", None) or "") if torch else ""
    return bool(root) and filename.startswith(root + os.sep)


def _error(stage: str, what: str, seconds, memory_mb) -> LimitExceeded:
    return LimitExceeded(
        f"stopped: it {what}",
        where=f"stage {stage}",
        hint="raise limits.stage_seconds / limits.stage_memory_mb in the spec, or give the "
        "stage less work (fewer samples, a smaller model)",
    )
