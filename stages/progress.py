"""Progress of long loops inside stages (batches), reported to whoever listens.

A stage calls ``tick(task, done, total)`` as it goes; the CLI installs a listener (a rich
progress bar) with ``listening(fn)``; with no listener a tick costs one lookup. The
listener is process-wide, not a context variable: Prefect runs tasks in worker threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Listener = Callable[[str, int, int], None]
_LISTENER: list[Listener | None] = [None]


def tick(task: str, done: int, total: int) -> None:
    """Report that ``task`` has done ``done`` of ``total`` units."""
    fn = _LISTENER[0]
    if fn is not None:
        fn(task, done, total)


@contextmanager
def listening(fn: Listener | None) -> Iterator[None]:
    """Send every tick inside the block to ``fn`` (None: nobody listens)."""
    previous, _LISTENER[0] = _LISTENER[0], fn
    try:
        yield
    finally:
        _LISTENER[0] = previous
