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
dropped). A run checks the numpy inputs against the geometry (dtype, shape, strides,
writeable, which share memory), checks that nothing else holds the plan's watched buffers,
sets the kernels' thread count, makes the one ctypes call of ``qp_run_plan`` and copies the
output views. Once the geometry matches it wakes the kernels' pool (``qp_pool_wake``) when
it will use more than one thread, so that a worker asleep since the last run spins by the
first kernel. Anything else returns None and the executor's own path runs, as before:
another geometry or dtype, an input that is not a writeable numpy array, a watched buffer
in use, another compiled library (tracing), a call that returns another value than
recorded. Same calls on the same memory as :meth:`Frozen.run`, so the same outputs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from simulator.kernels.exec_layout import to_reference
from simulator.program.isa import Program
from simulator.runtime import native, threads
from simulator.runtime.frozen import Frozen
from simulator.runtime.replay import input_key, span, unshared


def geometry(xs: list) -> tuple | None:
    """What a plan's numpy inputs must match: per input dtype, shape and byte strides, and
    which inputs share a data pointer; None when one is not a writeable numpy array with
    non-negative strides (the executor copies those first)."""
    if not all(type(x) is np.ndarray and x.flags.writeable for x in xs):
        return None
    if any(s < 0 for x in xs for s in x.strides):
        return None
    ptrs = [x.__array_interface__["data"][0] for x in xs]
    return (*((x.dtype, x.shape, x.strides) for x in xs), tuple(map(ptrs.index, ptrs)))


def raw_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of ``t`` (its shape, strides and dtype) over the raw memory of its
    storage: it holds no reference to the storage, so :func:`unshared` still sees the plan's
    buffers alone. Valid while the storage lives (the plan holds it)."""
    start, nbytes = span(t)
    dtype = torch.empty(0, dtype=t.dtype).numpy().dtype
    memory = (ctypes.c_char * nbytes).from_address(start)
    return np.ndarray(tuple(t.shape), dtype, memory, t.storage_offset() * dtype.itemsize,
                      tuple(s * dtype.itemsize for s in t.stride()))  # fmt: skip


@dataclass(frozen=True, eq=False)
class FastRun:
    """A frozen plan's run for one input geometry (module docstring)."""

    names: tuple[str, ...]  # the program inputs, in the plan's order
    key: tuple  # geometry() of the inputs it was built on
    frozen: Frozen
    lib: object  # the compiled library the plan's pointers belong to
    pointers: tuple[int, ...]  # Slots.pointers() of the plan
    inputs: ctypes.Array  # the input pointers, rewritten per run
    outs: dict[str, np.ndarray]  # program output -> raw view, reference layout

    @classmethod
    def build(cls, frozen: Frozen, program: Program, inputs: dict) -> FastRun | None:
        """The fast run of ``frozen`` for the geometry of ``inputs`` (those of the run that
        just used the plan), or None: an output that views an input or leaves the plan's
        memory in the reference layout, inputs the executor converted first, or a plan
        without compiled calls."""
        names = tuple(program.inputs)
        xs = [inputs.get(name) for name in names]
        key, s = geometry(xs), frozen.slots
        if key is None or s.kernel.numel() == 0 or native.library() is None:
            return None
        if input_key([torch.from_numpy(x) for x in xs]) != frozen.key:
            return None  # the executor converted them (dtype) before the plan saw them
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
        return cls(names, key, frozen, native.library(), s.pointers(),
                   (ctypes.c_int64 * len(names))(), outs)  # fmt: skip

    def run(self, inputs: dict, n: int, timed: bool) -> dict[str, np.ndarray] | None:
        """The program outputs (the caller's own copies) for ``inputs`` on ``n`` threads, or
        None when this run is not the fast run's (module docstring). ``timed``: each
        instruction's seconds kept (``frozen.slots.timings()``)."""
        xs = [inputs.get(name) for name in self.names]
        if geometry(xs) != self.key or native.library() is not self.lib:
            return None  # another geometry (a batch split's whole batch): no wake, whose
            # worker would spin on a core the split's threads need
        if n > 1:  # the pool's sleeping workers wake while the rest runs up to the kernels
            self.lib.qp_pool_wake()
        if not all(map(unshared, self.frozen.watched)):
            return None
        for i, x in enumerate(xs):
            self.inputs[i] = x.__array_interface__["data"][0]
        with threads.kernel_threads(native.untraced(), n):
            done = self.frozen.slots.call(self.lib, self.pointers,
                                          ctypes.addressof(self.inputs), timed)  # fmt: skip
        if not done:
            return None
        return {name: v.copy() for name, v in self.outs.items()}
