"""How many threads a run uses: the compiled kernels every core, torch the cores others leave.

The compiled kernels' thread pool (simulator/csrc/qpool.c) waits only for chunks a worker
has claimed and wakes its workers off the calling thread's core, so a worker on a core
another process holds adds its share of that core and stalls nothing: with a busy loop on
one of 2 cores, ResNet-18 at 224, batch 1, took 27.2 ms a run on 2 threads against 30.9
ms on 1, digits at batch 256 2.6 ms against 4.1 (bench/README.md, "Timing after a real
settle"). A run's kernels therefore take :func:`kernel_count` threads, every core this
process may run on, and set them only around its own calls (:func:`kernel_threads`),
restoring torch's count after.

torch's own OpenMP regions still end in a barrier that waits for the thread on a busy
core (ResNet-18 at 224, batch 8, when the kernels used OpenMP the same way: 316 ms a run
on 2 threads against 44 ms on 1; bench/README.md, "Under load"). Float evaluation in
torch (stages/evaluate.py) takes :func:`run_threads`, from the CPU time other processes
used over the last :data:`WINDOW` seconds (``/proc/stat`` busy time minus this process's
own).

``QPARITY_THREADS=<n>`` fixes both counts (tests, bench comparisons); unset or ``auto``,
they follow the cores.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

from schemas.errors import SimulatorError

WINDOW = 0.25
"""Seconds of CPU accounting a decision looks back on (its ticks are 10 ms: +-0.1 core)."""
HEADROOM = 0.25
"""A thread is added for a core at least 0.75 free: on a half-free core a second thread
only makes every region wait for it."""


def threads_for(others_busy: float, allowed: int, machine: int) -> int:
    """Threads for a run when other processes use ``others_busy`` cores (of ``machine``)
    and this process may run on ``allowed`` of them: one per core that stays (mostly)
    free, at least one."""
    busy_here = max(others_busy - (machine - allowed), 0.0)  # others on cores we may use
    return max(1, min(allowed, int(allowed - busy_here + HEADROOM)))


def _proc_busy() -> float | None:
    """Seconds all cores were busy since boot (``/proc/stat``: all but idle and iowait)."""
    try:
        with open("/proc/stat") as fh:
            v = [int(t) for t in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class FreeCores:
    """Cores other processes used over the last :data:`WINDOW` seconds, re-sampled at most
    once a window: ``/proc/stat`` is read only then (a read costs 20-150 us here, 3-4%
    of MobileNetV2's 3.5 ms run at batch 1 when it was read every run)."""

    def __init__(self, busy: Callable[[], float | None] = _proc_busy,
                 own: Callable[[], float] = _own_cpu,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._busy, self._own, self._clock = busy, own, clock
        self._last: tuple[float, float, float] | None = None
        self.others = 0.0  # cores; 0 until a first window has passed

    def others_busy(self) -> float:
        """Other processes' cores over the last completed window (0.0 before one)."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < WINDOW:
            return self.others
        busy = self._busy()
        if busy is None:
            return self.others
        if self._last is None:
            self._last = (now, busy, self._own())
            return self.others
        t0, busy0, own0 = self._last
        own = self._own()
        self.others = max((busy - busy0) - (own - own0), 0.0) / (now - t0)
        self._last = (now, busy, own)
        return self.others


_CORES = FreeCores()
_MACHINE = os.cpu_count()  # once: each call reads sysfs (about 6 us)


def run_threads(cores: FreeCores | None = None) -> int:
    """Threads for torch's float evaluation: ``$QPARITY_THREADS`` when set to a number, else
    one per core the other processes leave free (:func:`threads_for`)."""
    env = os.environ.get("QPARITY_THREADS", "auto")
    allowed = len(os.sched_getaffinity(0))
    if env != "auto":
        if not env.isdigit() or int(env) < 1:
            raise SimulatorError(f"QPARITY_THREADS={env!r} is not a thread count",
                                 where="environment", hint="set a number >= 1, or auto")  # fmt: skip
        return int(env)
    busy = (cores or _CORES).others_busy()
    return threads_for(busy, allowed, _MACHINE or allowed)


def kernel_count() -> int:
    """Threads for a run's compiled kernels, and workers for its batch split
    (:mod:`simulator.runtime.split`): ``$QPARITY_THREADS`` when set to a number, else
    every core this process may run on (module docstring)."""
    env = os.environ.get("QPARITY_THREADS", "auto")
    return run_threads() if env != "auto" else len(os.sched_getaffinity(0))


@contextlib.contextmanager
def kernel_threads(lib, n: int) -> Iterator[int]:
    """OpenMP's thread count (the calling thread's, which the kernels and torch's OpenMP
    regions read) set to ``n`` inside the block and restored after; yields the previous."""
    if lib is None:
        yield 0
        return
    prev = lib.qp_threads(n)
    try:
        yield prev
    finally:
        lib.qp_threads(prev)
