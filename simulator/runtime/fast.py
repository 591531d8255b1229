"""A frozen plan's run straight from numpy inputs, with no torch call on the way.

:meth:`Executor.run <simulator.runtime.executor.Executor.run>` reaches the frozen plan
(:mod:`simulator.runtime.frozen`) through torch: ``from_numpy`` of each input, its
``data_ptr``, the plan's pointers, ``as_strided`` views of the outputs, ``to_reference``
and ``.numpy()``. With warm caches that is about 0.1 ms a run; when the last-level cache
is cold (a model run now and then on a shared host) each of those calls reads torch's
dispatcher code and data from memory again, about 0.5 ms of ResNet-18's 3.6 ms at batch 1
(bench/README.md, "The Python on the way").

Once the plan has run whole on inputs of one geometry, :class:`FastRun` holds for that
geometry the plan's arguments as integers and each program output as a numpy view of the
memory the plan writes it to, already in the reference layout (NCHW, padding channels
dropped). A run checks that nothing else holds the plan's watched buffers (by their
storages' addresses, kept from the build) and makes one ctypes call, ``qp_run_np``
(csrc/qnpy.c), given each input as its object's address. The C side checks each input
against the geometry (an ndarray of that dtype, shape and byte strides, writeable, the
same inputs sharing memory), reading numpy's array struct, and takes its data pointer
there; it reads the thread count as :func:`threads.kernel_count
<simulator.runtime.threads.kernel_count>` does, from ``$QPARITY_THREADS`` or the process's
cores; wakes the pool's sleeping workers when it will use more than one thread (so that a
worker asleep since the last run spins by the first parallel kernel); runs
``qp_run_plan`` and restores the thread count. Then the output views are copied. After
idle every Python call on the way costs tens of microseconds (code and data read from
memory again): the geometry's check from Python took 0.045-0.054 ms of MobileNetV2's
1.6 ms run at batch 1 as bench/simulator.py times it, the thread count 0.028 ms, the
check in C 0.015 ms with its ctypes call (bench/README.md). The build checks on its own
inputs that the C side reads an array as Python sees it (:func:`readable`), and builds no
fast run where it does not (another Python or numpy ABI). Anything else returns None and
the executor's own path runs, as before: another geometry or dtype object, an input that
is not a writeable numpy array, a watched buffer in use, another compiled library
(tracing), a thread count the C side does not read (the Python path names it), a call
that returns another value than recorded. Same calls on the same memory as
:meth:`Frozen.run`, so the same outputs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from simulator.kernels.exec_layout import to_reference
from simulator.program.isa import Program
from simulator.runtime import native
from simulator.runtime.frozen import Frozen
from simulator.runtime.replay import input_key, span, storage_id, unshared_storage


def address(x: np.ndarray) -> int:
    """The data pointer of numpy array ``x``."""
    return x.__array_interface__["data"][0]


def geometry(xs: list) -> tuple | None:
    """What a plan's numpy inputs must match: per input dtype, shape and byte strides, and
    which inputs share a data pointer; None when one is not a writeable numpy array with
    non-negative strides (the executor copies those first)."""
    if not all(type(x) is np.ndarray and x.flags.writeable for x in xs):
        return None
    if any(s < 0 for x in xs for s in x.strides):
        return None
    ptrs = [address(x) for x in xs]
    return (*((x.dtype, x.shape, x.strides) for x in xs), tuple(map(ptrs.index, ptrs)))


def pointers(xs: list, key: tuple) -> list[int] | None:
    """The data pointers of numpy inputs ``xs`` when their :func:`geometry` is ``key``, else
    None: the same test, in one pass that reads each array's attributes once."""
    ptrs = []
    for x, (dtype, shape, strides) in zip(xs, key[:-1], strict=True):
        if type(x) is not np.ndarray or x.shape != shape or x.strides != strides:
            return None
        if x.dtype != dtype or not x.flags.writeable:
            return None
        ptrs.append(address(x))
    return ptrs if tuple(map(ptrs.index, ptrs)) == key[-1] else None


def raw_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of ``t`` (its shape, strides and dtype) over the raw memory of its
    storage: it holds no reference to the storage, so :func:`unshared` still sees the plan's
    buffers alone. Valid while the storage lives (the plan holds it)."""
    start, nbytes = span(t)
    dtype = torch.empty(0, dtype=t.dtype).numpy().dtype
    memory = (ctypes.c_char * nbytes).from_address(start)
    return np.ndarray(tuple(t.shape), dtype, memory, t.storage_offset() * dtype.itemsize,
                      tuple(s * dtype.itemsize for s in t.stride()))  # fmt: skip


NP_VIEW_DIMS = 8
"""Ranks up to which ``qp_np_view`` (csrc/qnpy.c) reports an array's shape and strides."""


def readable(x: np.ndarray, lib) -> bool:
    """Whether ``qp_np_view`` of ``lib`` reads numpy array ``x`` as Python sees it: its
    type, dtype, data pointer, writeable flag, rank, shape and byte strides."""
    out = (ctypes.c_int64 * (5 + 2 * NP_VIEW_DIMS))()
    lib.qp_np_view(id(x), out)
    want = [id(type(x)), id(x.dtype), address(x), x.ndim, *x.shape, *x.strides]
    got = [*out[:3], out[4], *out[5 : 5 + 2 * x.ndim]]
    return x.ndim <= NP_VIEW_DIMS and got == want and bool(out[3] & 0x400) == x.flags.writeable


def spec(key: tuple) -> tuple[ctypes.Array, tuple[int, ...]]:
    """``qp_run_np``'s input spec for inputs of :func:`geometry` ``key`` (whose dtype objects
    the caller keeps alive: the spec holds their addresses) and the slot of each input's
    object address in it."""
    values, at = [len(key) - 1, id(np.ndarray)], []
    for (dtype, shape, strides), first in zip(key[:-1], key[-1], strict=True):
        at.append(len(values))
        values += [0, id(dtype), len(shape), first, *shape, *strides]
    return (ctypes.c_int64 * len(values))(*values), tuple(at)


def hold(where: ctypes.Array, objects: tuple[tuple[int, str], ...], inputs) -> list:
    """Each input's object address (``objects``: slot in ``where``, input name) written into
    ``where``; returns the objects, which the caller holds until its call returns (a mapping
    may make them as they are read, and the C side reads them by address)."""
    xs = [inputs.get(name) for _, name in objects]
    for (at, _), x in zip(objects, xs, strict=True):
        where[at] = id(x)
    return xs


@dataclass(frozen=True, eq=False)
class FastRun:
    """A frozen plan's run for one input geometry (module docstring)."""

    names: tuple[str, ...]  # the program inputs, in the plan's order
    key: tuple  # geometry() of the inputs it was built on (keeps their dtype objects)
    frozen: Frozen
    lib: object  # the compiled library the plan's pointers belong to
    plan: ctypes.Array  # Slots.pointers() of the plan, qp_run_np's first argument
    spec: ctypes.Array  # qp_run_np's input spec (spec()); the object addresses set per run
    objects: tuple[tuple[int, str], ...]  # (slot in spec, input name) per input
    outs: dict[str, np.ndarray]  # program output -> raw view, reference layout
    watched: tuple[int, ...]  # storage_id() of the frozen plan's watched buffers

    @classmethod
    def build(cls, frozen: Frozen, program: Program, inputs: dict) -> FastRun | None:
        """The fast run of ``frozen`` for the geometry of ``inputs`` (those of the run that
        just used the plan), or None: an output that views an input or leaves the plan's
        memory in the reference layout, inputs the executor converted first or that the C
        side does not read as Python does, or a plan without compiled calls."""
        names, lib = tuple(program.inputs), native.library()
        xs = [inputs.get(name) for name in names]
        key, s = geometry(xs), frozen.slots
        if key is None or s.kernel.numel() == 0 or lib is None:
            return None
        if input_key([torch.from_numpy(x) for x in xs]) != frozen.key:
            return None  # the executor converted them (dtype) before the plan saw them
        if not all(readable(x, lib) for x in xs):
            return None
        outs = {}
        for name in program.outputs:
            kind, k, *view = frozen.outs[name]
            if kind != "buf":
                return None
            t = frozen.buffers[k].as_strided(*view)
            ref = to_reference(t, program.layouts.get(name))
            if span(ref) != span(frozen.buffers[k]):  # the reference layout is a copy
                return None
            outs[name] = raw_view(ref)
        plan, (where, at) = s.pointers(), spec(key)
        return cls(names, key, frozen, lib, (ctypes.c_int64 * len(plan))(*plan), where,
                   tuple(zip(at, names, strict=True)), outs,
                   tuple(map(storage_id, frozen.watched)))  # fmt: skip

    def run(self, inputs: dict, n: int, timed: bool) -> dict[str, np.ndarray] | None:
        """The program outputs (the caller's own copies) for ``inputs`` on ``n`` threads (0:
        :func:`~simulator.runtime.threads.kernel_count`'s, read in C), or None when this run
        is not the fast run's (module docstring). ``timed``: each instruction's seconds kept
        (``frozen.slots.timings()``)."""
        held = hold(self.spec, self.objects, inputs)
        if native.library() is not self.lib or not all(map(unshared_storage, self.watched)):
            return None
        done = self.lib.qp_run_np(self.plan, self.spec, n, timed)
        del held  # the C side read the inputs by address: held through the call
        if done != 1:
            return None
        return {name: v.copy() for name, v in self.outs.items()}
