"""Replay of an instruction from its previous runs, without re-deciding how to run it.

Every run of a kernel (``fn(instr, bufs, consts)``) re-derives the same things from the
same constants and the same input geometry: which path applies, which bounds hold, which
compiled function to call with which scalars. That costs 10-30 us of Python and torch
calls per instruction, as much as a small kernel itself. :class:`Replays` learns an
instruction over its first runs and then does only what changes from run to run:

- **views**: a LAYOUT whose outputs all view its input is replayed as the same views of the
  new input (shape, strides and offset from the input's), no dispatch at all;
- **compiled calls**: a kernel whose work is one or more calls into :mod:`simulator.runtime.native`
  writing buffers from :func:`simulator.runtime.native.empty` is replayed as those calls: fresh
  buffers, the input and buffer pointers substituted, every other argument as recorded.

Learning a compiled replay takes two runs of the kernel under
:func:`simulator.runtime.native.tracing` on inputs of the same geometry. Every pointer argument
must be an input's data, a buffer of the run, or a constant: the very same tensor object
in both runs (a copy made per run, such as ``x.contiguous()`` of a strided input, is a new
object each time, so that instruction keeps its kernel). Calls, scalars and return values
must agree, and each output must be a view of a buffer. Then the replay runs once on the
second run's inputs with its buffers filled with a byte pattern and must give exactly the
kernel's outputs (a byte the calls do not write, or a torch step after them, shows up).
A replay whose call returns another value than recorded (LayerNorm's and QUANTIZE's
"out of range" flags) runs the kernel instead, as does any input of another geometry.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from simulator.program.isa import Instruction, Op
from simulator.runtime import native

_IN, _BUF = 0, 1
_NEVER = object()  # an instruction whose kernel cannot be replayed: always run it
HOLD_BYTES, HOLD_TOTAL = 32 << 20, 256 << 20
"""A replay keeps its buffers (up to HOLD_BYTES, and up to HOLD_TOTAL for all the replays
of one program) for its next run, which reuses them when no tensor of the last run still
refers to them: no allocation, and memory the caches still hold. Other buffers are
allocated per run, as the kernels do."""
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)  # None: never reuse
_ALONE = 2  # the use count of a tensor's storage seen through .untyped_storage() alone


@dataclass(frozen=True)
class _Call:
    fn: Callable
    args: tuple  # as recorded; the pointer slots are replaced per run
    slots: tuple[tuple[int, int, int, int], ...]  # (argument, _IN or _BUF, index, byte delta)
    rc: object


@dataclass(frozen=True)
class _Calls:
    """A kernel as its compiled calls (see the module docstring)."""

    key: tuple
    buffers: tuple[tuple[torch.Size, torch.dtype], ...]
    calls: tuple[_Call, ...]
    outs: tuple[tuple[int, torch.Size, tuple[int, ...], int] | int, ...]  # buffer k: all of it
    consts: tuple[torch.Tensor, ...]  # kept alive: their pointers are in the calls
    held: list = field(default_factory=list, compare=False)  # the last run's buffers
    budget: list = field(default_factory=lambda: [HOLD_TOTAL], compare=False)  # bytes left

    def run(self, xs: list[torch.Tensor], fill: int | None = None, record=None) -> list | None:
        """The outputs for inputs ``xs``, or None when a call returned another value.
        ``record``: a list that gets ``(fn, args, pointer positions, return value, buffers,
        whether they are the held ones)`` per call (:mod:`simulator.runtime.frozen`)."""
        bufs = self._buffers(fill)
        ptrs = ([x.data_ptr() for x in xs], [b.data_ptr() for b in bufs])
        for call in self.calls:
            args = list(call.args)
            for at, kind, index, delta in call.slots:
                args[at] = ptrs[kind][index] + delta
            rc = call.fn(*args)
            if record is not None:
                pointers = tuple(at for at, *_ in call.slots)
                record.append((call.fn, args, pointers, rc, bufs, bufs is self.held))
            if rc != call.rc:
                return None
        return [bufs[o] if isinstance(o, int) else _view(bufs[o[0]], *o[1:]) for o in self.outs]

    def _buffers(self, fill: int | None) -> list[torch.Tensor]:
        """The last run's buffers when nothing else holds them any more, else new ones."""
        held = self.held
        if held and fill is None and all(map(unshared, held)):
            return held
        bufs = [torch.empty(size, dtype=dtype) for size, dtype in self.buffers]
        if fill is not None:
            for b in bufs:
                b.view(-1).view(torch.uint8).fill_(fill)
        elif held or self._charge(sum(b.untyped_storage().nbytes() for b in bufs)):
            held[:] = bufs
        return bufs

    def _charge(self, size: int) -> bool:
        """Take ``size`` bytes from the program's budget for held buffers, if it has them."""
        if size > min(HOLD_BYTES, self.budget[0]):
            return False
        self.budget[0] -= size
        return True


@dataclass(frozen=True)
class _View:
    """A LAYOUT's outputs as (shape, strides, storage offset from the input's)."""

    key: tuple
    outs: tuple[tuple[torch.Size, tuple[int, ...], int], ...]

    def run(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        x = xs[0]
        base = x.storage_offset()
        return [x.as_strided(size, stride, base + delta) for size, stride, delta in self.outs]


class Replays:
    """Per instruction index: how its next run can skip its kernel (module docstring)."""

    def __init__(self):
        self._state: dict[int, object] = {}
        self._budget = [HOLD_TOTAL]  # bytes the replays may still hold between runs
        self.served = 0  # instructions replayed since the count was last reset
        self.record: list | None = None  # a list: (index, op, calls, replay) per replayed call

    def __contains__(self, i: int) -> bool:
        return isinstance(self._state.get(i), _View | _Calls)

    def run(self, i: int, instr: Instruction, xs: list, kernel: Callable[[], list]) -> list:
        """Instruction ``i``'s outputs on inputs ``xs``: replayed, or ``kernel()``."""
        state = self._state.get(i)
        if state is _NEVER:
            return kernel()
        key = input_key(xs)
        if isinstance(state, _View | _Calls):
            if state.key != key:
                return kernel()
            ys = state.run(xs) if isinstance(state, _View) else self._calls(i, instr, state, xs)
            if ys is None:
                return kernel()
            self.served += 1
            return ys
        with native.tracing() as trace:
            ys = kernel()
        if instr.op is Op.LAYOUT and len(xs) == 1 and not trace.calls:
            return self._learn_view(i, key, xs, ys)
        self._learn_calls(i, key, xs, ys, trace)
        return ys

    def _calls(self, i: int, instr: Instruction, state: _Calls, xs: list) -> list | None:
        if self.record is None:
            return state.run(xs)
        calls = []
        self.record.append((i, instr.op, calls, state))
        return state.run(xs, record=calls)

    def _learn_view(self, i: int, key: tuple, xs: list, ys: list) -> list:
        x = xs[0]
        ptr = x.untyped_storage().data_ptr()
        if any(y.untyped_storage().data_ptr() != ptr for y in ys):
            self._state[i] = _NEVER
            return ys
        outs = tuple((y.shape, y.stride(), y.storage_offset() - x.storage_offset()) for y in ys)
        self._state[i] = _View(key, outs)
        return ys

    def _learn_calls(self, i: int, key: tuple, xs: list, ys: list, trace) -> None:
        """First run (or the first on a new geometry): keep the structure; second: compile,
        check, keep or give up."""
        calls = _compile(key, xs, ys, trace, self._budget)
        first = self._state.get(i)
        if calls is None or (first is not None and first[1].key == key and not _same(first, calls)):
            self._state[i] = _NEVER
        elif first is None or first[1].key != key:
            self._state[i] = ("first", calls)
        else:
            got = calls.run(xs, fill=0xA5)
            ok = got is not None and all(_equal(a, b) for a, b in zip(got, ys, strict=True))
            self._state[i] = calls if ok else _NEVER


def input_key(xs: list) -> tuple:
    """The input geometry a replay is valid for, with which inputs share a data pointer."""
    ptrs = [x.data_ptr() for x in xs]
    return (*((x.dtype, x.shape, x.stride()) for x in xs), tuple(map(ptrs.index, ptrs)))


def _compile(key: tuple, xs: list, ys: list, trace, budget: list) -> _Calls | None:
    """The trace as a :class:`_Calls`, or None when it is not replayable as it stands."""
    if not trace.calls:
        return None
    inputs = [x.data_ptr() for x in xs]
    spans = [span(b) for b in trace.allocs]
    consts, calls = [], []
    for fn, args, rc in trace.calls:
        slots = []
        for at, arg in enumerate(args):
            if not isinstance(arg, ctypes.c_void_p) or id(arg) not in trace.pointers:
                continue
            p = arg.value or 0
            src = _source(p, inputs, spans)
            if src is None:
                consts.append(trace.pointers[id(arg)][1])
            else:
                slots.append((at, *src))
        calls.append(_Call(fn, args, tuple(slots), rc))
    outs = [buffer_view(y, spans) for y in ys]
    if any(o is None for o in outs):
        return None
    buffers = [(b.shape, b.dtype) for b in trace.allocs]
    for j, (y, (k, *_)) in enumerate(zip(ys, outs, strict=True)):
        if y.dtype == trace.allocs[k].dtype and _whole(y, spans[k][1]):
            buffers[k], outs[j] = (y.shape, y.dtype), k  # allocated as the output it is
    return _Calls(key, tuple(buffers), tuple(calls), tuple(outs), tuple(consts), budget=budget)


def _whole(y: torch.Tensor, nbytes: int) -> bool:
    """``y`` is its buffer's every byte, in order."""
    return y.is_contiguous() and y.storage_offset() == 0 and y.numel() * y.itemsize == nbytes


def _source(p: int, inputs: list[int], spans) -> tuple[int, int, int] | None:
    """``(_IN, j, 0)`` for input j's data, ``(_BUF, k, delta)`` inside buffer k, or None."""
    if p in inputs:
        return _IN, inputs.index(p), 0
    inside = find_span(p, spans)
    return None if inside is None else (_BUF, *inside)


def span(t: torch.Tensor) -> tuple[int, int]:
    """``(start, nbytes)`` of the memory behind ``t`` (its whole storage)."""
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def find_span(p: int, spans) -> tuple[int, int] | None:
    """``(k, p - start)`` for the first span k holding address ``p``, else None."""
    for k, (start, size) in enumerate(spans):
        if start <= p < start + size:
            return k, p - start
    return None


def buffer_view(y: torch.Tensor, spans):
    """``y`` as ``(buffer index, size, stride, storage offset)`` when it views one of the
    buffers spanned by ``spans`` (``(start, nbytes)`` each), else None."""
    base = y.untyped_storage().data_ptr()
    for k, (start, _) in enumerate(spans):
        if base == start:
            return k, y.shape, y.stride(), y.storage_offset()
    return None


def _view(buf: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    return buf.as_strided(size, stride, offset)


def unshared(t: torch.Tensor) -> bool:
    """No tensor but ``t`` refers to its memory (no view, no numpy array of it is alive)."""
    return unshared_storage(storage_id(t))


def storage_id(t: torch.Tensor) -> int:
    """The address of ``t``'s storage, for :func:`unshared_storage` (valid while ``t`` lives)."""
    return t.untyped_storage()._cdata


def unshared_storage(storage: int) -> bool:
    """:func:`unshared` of the tensor whose :func:`storage_id` is ``storage`` (the caller holds
    it), without the storage object each ``untyped_storage()`` call makes."""
    return _USE_COUNT is not None and _USE_COUNT(storage) <= _ALONE


def _same(first: tuple, second: _Calls) -> bool:
    """Two runs' :class:`_Calls` agree: geometry, calls, scalars, and constants by identity."""
    a = first[1]
    if a.key != second.key or a.buffers != second.buffers or a.outs != second.outs:
        return False
    if len(a.consts) != len(second.consts) or any(
        u is not v for u, v in zip(a.consts, second.consts, strict=True)
    ):
        return False
    return len(a.calls) == len(second.calls) and all(
        _same_call(u, v) for u, v in zip(a.calls, second.calls, strict=True)
    )


def _same_call(u: _Call, v: _Call) -> bool:
    if u.fn is not v.fn or u.slots != v.slots or u.rc != v.rc or len(u.args) != len(v.args):
        return False
    pointers = {at for at, *_ in u.slots}
    return all(
        at in pointers or _value(a) == _value(b)
        for at, (a, b) in enumerate(zip(u.args, v.args, strict=True))
    )


def _value(arg):
    """A recorded argument as a comparable value (ctypes pointers and arrays by content)."""
    if isinstance(arg, ctypes.c_void_p):
        return ("ptr", arg.value)
    if isinstance(arg, ctypes.Array):
        return ("array", tuple(arg))
    return arg


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
