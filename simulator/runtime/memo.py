"""Values derived once from a long-lived object (a program constant, a cached epilogue).

A kernel runs once per batch, and the small conversions of its constants (a multiplier as
a Python int, per-channel scales widened to float64 lanes) cost a few torch calls each
time. :func:`derived` computes each once per ``(owner, key)`` and stores it on ``owner``
itself, so it lives exactly as long as the program that owns the constant. (A weakly keyed
table does not work for tensors: their ``==`` is elementwise.)
"""

from __future__ import annotations

from collections.abc import Callable

_SLOT = "_qparity_derived"


def derived(owner, key, build: Callable[[], object]):
    """``build()`` once per ``(owner, key)``, kept in ``owner.__dict__`` (a torch tensor or
    a dataclass instance: the values live and die with it). The result is shared: callers
    must not mutate it."""
    table = owner.__dict__.setdefault(_SLOT, {})
    if key not in table:
        table[key] = build()
    return table[key]


def as_int(t) -> int:
    """A one-element constant tensor as a Python int, converted once."""
    return derived(t, "int", lambda: int(t.reshape(())))
