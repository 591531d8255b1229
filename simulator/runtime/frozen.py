"""A whole program replayed as one list of compiled calls at fixed addresses.

Once every instruction of a program replays (:mod:`simulator.runtime.replay`: views, or compiled
calls into buffers the replay holds from run to run), a run is the same calls into the
same buffers each time; only the program inputs move. :func:`freeze` turns one such run,
recorded, into a :class:`Frozen` plan: each call with its arguments resolved, every pointer
either fixed (a held buffer, a view of one, a constant) or the program input's data
pointer plus a byte offset, filled in per run. A run of the plan is then one ctypes call
of the compiled runner over the calls' arguments packed as int64 slots
(:mod:`simulator.runtime.packed`), with none of the per-instruction Python of the executor (about
a quarter of a small model's run) and none of the per-call argument conversion of ctypes
(about 4 us a call).

The plan also lays the buffers out again: each replay holds its own buffers, so a run
writes all of them (8 MB for the transformer example, four times the core's L2 cache) and
most writes miss the caches. The plan's calls instead point into one arena where buffers
whose uses do not overlap (from the first call that touches one to the last) share memory
(1 MB for the transformer), so a run stays in cache. That is sound because a replay is
adopted only when it gives the same outputs over buffers filled with garbage
(:mod:`simulator.runtime.replay`): no call needs what a buffer held before its first touch in a
run. Buffers that program outputs view keep their own memory.

Calls joined into one pass where the plan shows the buffer between them is theirs alone
(:mod:`simulator.runtime.fuse`: the input's quantize, layout and the stem's pad) take their
places in the plan before the arena is laid out.

A plan is built only when every pointer of the recorded run is classified and every
program output is a view of a held buffer or of an input; otherwise the executor keeps its
per-instruction path. It runs only on inputs of the recorded geometry and when no tensor
outside it refers to a buffer it writes besides its arena (one that outputs view, which a
caller may still hold as a capture of an earlier run); a call
that returns another value than recorded (a range flag) abandons the plan for that run,
and the executor runs the program instruction by instruction instead.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from simulator.program.isa import Op
from simulator.runtime import fuse, native, packed
from simulator.runtime.replay import buffer_view, find_span, input_key, span, unshared


@dataclass(frozen=True)
class Slots:
    """A plan's calls as :mod:`simulator.runtime.packed` slots for ``qp_run_plan``: per call its
    kernel (index in ``native.PACKED``), first slot, return value and instruction group;
    the slots; the input fills as (slot, input, byte offset) triples; the instructions
    ``(index, op)`` of the groups and room for their seconds."""

    kernel: torch.Tensor
    start: torch.Tensor
    slots: torch.Tensor  # rewritten in place by the fills each run
    rc: torch.Tensor
    fill: torch.Tensor
    group: torch.Tensor
    instructions: tuple[tuple[int, Op], ...]
    seconds: torch.Tensor

    @classmethod
    def of(cls, calls) -> Slots:
        kernel, start, slots, rc, fill, group, instrs = [], [], [], [], [], [], []
        for i, op, fn, args, fills, ret in calls:
            types = native.SIGNATURES[fn.__name__][0]
            kernel.append(native.PACKED.index(fn.__name__))
            start.append(len(slots))
            fill += [v for at, j, delta in fills for v in (len(slots) + at, j, delta)]
            slots += [packed.slot(t, a) for t, a in zip(types, args, strict=True)]
            rc.append(0 if ret is None else int(ret))
            if not instrs or instrs[-1][0] != i:
                instrs.append((i, op))
            group.append(len(instrs) - 1)
        ints = [torch.tensor(v, dtype=torch.int64) for v in (kernel, start, slots, rc, fill, group)]
        return cls(*ints, tuple(instrs), torch.zeros(len(instrs), dtype=torch.float64))

    def run(self, xs: list[torch.Tensor], timed: bool) -> bool:
        """All calls on inputs ``xs``; False when one returned another value than recorded.
        ``timed``: each instruction's seconds into :attr:`seconds` (:meth:`timings`)."""
        if self.kernel.numel() == 0:  # views only (a plan needs no compiled library then)
            return True
        inputs = (ctypes.c_int64 * len(xs))(*(x.data_ptr() for x in xs))
        return self.call(native.library(), self.pointers(), ctypes.addressof(inputs), timed)

    def pointers(self) -> tuple[int, ...]:
        """``qp_run_plan``'s arguments but the input pointers, as integers: the call count,
        the tensors' addresses and the fill count (torch does not move them, so a caller may
        keep these: :mod:`simulator.runtime.fast`)."""
        return (self.kernel.numel(), self.kernel.data_ptr(), self.start.data_ptr(),
                self.slots.data_ptr(), self.rc.data_ptr(), self.fill.numel() // 3,
                self.fill.data_ptr(), self.group.data_ptr(), self.seconds.data_ptr())  # fmt: skip

    def call(self, lib, pointers: tuple[int, ...], inputs: int, timed: bool) -> bool:
        """``qp_run_plan`` of ``lib`` with :meth:`pointers` and the input pointers at address
        ``inputs`` (int64 each); False when a call returned another value than recorded.
        ``timed``: each instruction's seconds into :attr:`seconds`."""
        *head, group, seconds = pointers
        return lib.qp_run_plan(*head, inputs, group, seconds if timed else None) == head[0]

    def timings(self) -> list[tuple[int, Op, float]]:
        """``(instruction, op, seconds)`` per instruction of the last timed run. Built when
        read, not in the run (:attr:`Executor.timings
        <simulator.runtime.executor.Executor.timings>`): its 90 tuples were 0.1 ms of a
        MobileNetV2 run timed after idle, 5% of it, on bench/simulator.py's clock."""
        return self.listed(self.seconds)

    def kept(self) -> Callable[[], list[tuple[int, Op, float]]]:
        """:meth:`timings` of the last run, as a call that a later run does not change."""
        return functools.partial(self.listed, self.seconds.clone())

    def listed(self, seconds) -> list[tuple[int, Op, float]]:
        """``(instruction, op, seconds)`` per instruction of ``seconds`` (this plan's, or a sum
        of them: a tensor or an array)."""
        return [(i, op, s) for (i, op), s in zip(self.instructions, seconds.tolist(), strict=True)]


@dataclass(frozen=True)
class Frozen:
    """The plan: ``calls`` as ``(instruction, op, fn, args, input fills, return value)``,
    where a fill ``(argument, input, byte offset)`` sets a pointer from an input; ``slots``
    the same calls packed for the compiled runner (``calls`` keeps alive the ctypes arrays
    whose addresses the slots hold)."""

    key: tuple
    calls: tuple[tuple[int, Op, object, list, tuple[tuple[int, int, int], ...], object], ...]
    buffers: tuple[torch.Tensor, ...]  # every buffer the calls write, held by their replays
    outs: dict[str, tuple]  # output -> ("in" | "buf", index, size, stride, storage offset)
    replays: tuple  # the instructions' replays: they keep the constants the calls point to
    arena: torch.Tensor  # the memory the calls use in place of the other buffers
    slots: Slots
    watched: tuple[torch.Tensor, ...]  # the buffers outside the arena that calls write

    def run(self, xs: list[torch.Tensor], timed: bool = False) -> dict | None:
        """The program outputs for inputs ``xs`` (the program's input order), or None when
        the plan does not apply to them (geometry, buffers in use, a changed return
        value). ``timed``: each instruction's seconds kept (``slots.timings()``)."""
        if input_key(xs) != self.key or not all(map(unshared, self.watched)):
            return None
        if not self.slots.run(xs, timed):
            return None
        return {name: _view(xs, self.buffers, *out) for name, out in self.outs.items()}


def freeze(record: list, xs: list[torch.Tensor], outputs: dict[str, torch.Tensor]):
    """The :class:`Frozen` plan of a recorded run (``Replays.record``: ``(index, op, calls,
    replay)``) on program inputs ``xs`` with program outputs ``outputs``, or None."""
    buffers = {id(b): b for _, _, calls, _ in record for *_, bufs, _ in calls for b in bufs}
    if any(not held for _, _, calls, _ in record for *_, held in calls):
        return None  # a buffer allocated for this run only: its address moves
    inputs, spans = [span(x) for x in xs], [span(b) for b in buffers.values()]
    plan, uses = [], []
    for i, op, calls, _ in record:
        for fn, args, pointers, rc, _, _ in calls:
            where = _pointers(args, pointers, xs, inputs, spans)
            if where is None:
                return None
            plan.append((i, op, fn, list(args), where[0], rc))
            uses.append(where[1])
    held = tuple(buffers.values())
    outs = {name: _source(y, xs, spans) for name, y in outputs.items()}
    if any(o is None for o in outs.values()):
        return None
    if any(fn.__name__ not in native.PACKED for _, _, fn, *_ in plan):
        return None  # a call the compiled runner has no wrapper for
    own = {o[1] for o in outs.values() if o[0] == "buf"}
    plan, uses = fuse.join(plan, uses, own)
    arena = _share(plan, uses, spans, own)
    return Frozen(input_key(xs), tuple(plan), held, outs, tuple(r for *_, r in record), arena,
                  Slots.of(plan), tuple(held[k] for k in sorted(own)))  # fmt: skip


def _pointers(args: list, pointers, xs, inputs, spans) -> tuple | None:
    """``(fills, uses)`` of one call: fills ``(argument, input j, byte offset)`` for pointers
    into an input, uses ``(argument, buffer k, byte offset)`` for pointers into a held
    buffer; None when a pointer is in neither."""
    fills, uses = [], []
    for at in pointers:
        inside = find_span(args[at], inputs)
        if inside is not None:
            fills.append((at, inside[0], args[at] - xs[inside[0]].data_ptr()))
            continue
        inside = find_span(args[at], spans)
        if inside is None:
            return None
        uses.append((at, *inside))
    return tuple(fills), uses


ALIGN = 64
"""Byte alignment of each buffer in the arena (a cache line)."""


def _share(plan: list, uses: list, spans, own: set[int]) -> torch.Tensor:
    """Point the calls of ``plan`` into one arena where buffers in use at disjoint call
    ranges share memory (buffers in ``own``, which outputs view, keep theirs); the arena."""
    live: dict[int, list[int]] = {}
    for n, call_uses in enumerate(uses):
        for _, k, _ in call_uses:
            live.setdefault(k, [n, n])[1] = n
    offsets, size = place({k: (spans[k][1], *r) for k, r in live.items() if k not in own})
    arena = torch.empty(size + ALIGN, dtype=torch.uint8)
    base = -(-arena.data_ptr() // ALIGN) * ALIGN
    for (*_, args, _, _), call_uses in zip(plan, uses, strict=True):
        for at, k, delta in call_uses:
            if k in offsets:
                args[at] = base + offsets[k] + delta
    return arena


def place(items: dict[int, tuple[int, int, int]]) -> tuple[dict[int, int], int]:
    """Byte offsets for buffers ``{k: (nbytes, first use, last use)}`` such that two
    buffers whose use ranges overlap never overlap in memory, and the total size: first
    fit (the lowest free offset, ``ALIGN``-aligned), in order of first use."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets = {}
    for k, (nbytes, first, last) in sorted(items.items(), key=lambda kv: kv[1][1]):
        size = -(-nbytes // ALIGN) * ALIGN
        at = 0
        for lo, hi in sorted((o, o + n) for o, n, a, b in placed if a <= last and first <= b):
            if at + size <= lo:
                break
            at = max(at, hi)
        offsets[k] = at
        placed.append((at, size, first, last))
    return offsets, max((o + n for o, n, _, _ in placed), default=0)


def _source(y: torch.Tensor, xs, spans) -> tuple | None:
    """An output as a view of input j or of held buffer k, else None."""
    base = y.untyped_storage().data_ptr()
    for j, x in enumerate(xs):
        if base == x.untyped_storage().data_ptr():
            return "in", j, y.shape, y.stride(), y.storage_offset() - x.storage_offset()
    view = buffer_view(y, spans)
    return None if view is None else ("buf", *view)


def _view(xs, buffers, kind: str, k: int, size, stride, offset: int) -> torch.Tensor:
    if kind == "in":
        return xs[k].as_strided(size, stride, xs[k].storage_offset() + offset)
    return buffers[k].as_strided(size, stride, offset)
