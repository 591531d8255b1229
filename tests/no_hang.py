"""A guard for tests of reads that must never block (a FIFO where a file belongs)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def fails_if_blocked(seconds: int = 30) -> Iterator[None]:
    """Fail the test if the block has not returned after ``seconds`` (SIGALRM, main thread).

    The failure is pytest's own (a BaseException), so no ``except OSError`` in the code
    under test can turn the interrupted read into an ordinary error and pass."""

    def blocked(signum, frame):
        pytest.fail(f"blocked for {seconds} s (a read waiting on a FIFO?)")

    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
