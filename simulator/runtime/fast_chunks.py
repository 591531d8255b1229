"""A batch split's chunks (:mod:`simulator.runtime.split`) in one ctypes call.

Run from Python, each chunk costs its thread a trip through the interpreter, and the
threads take turns at the GIL: after idle (code and data read from memory again) the
calling thread started its first chunk 0.4 ms into a MobileNetV2 batch-8 run and the pool
thread 0.2 ms, and the run ended 0.2 ms after the last chunk (the pool thread's return,
then the caller woken from its wait), 0.6-0.7 ms of a 9.5 ms run (bench/README.md).

Once every executor of the split (the owner and its twins) has a fast run
(:class:`~simulator.runtime.fast.FastRun`) for the chunks' geometry, :class:`FastChunks`
hands all chunks to ``qp_run_chunks`` (csrc/qplan.c): one task per executor on the
kernels' pool, each running its executor's plan on chunk after chunk while one is left
and copying each output into the batch's output at the chunk's place before its next run.
The same plans on the same inputs as the Python path, so the same outputs; it applies only
where each output is a contiguous view with the chunk's samples first (the batch's output
is then the chunks' outputs back to back), and steps aside (None) like a fast run does:
another geometry, a watched buffer in use, a call that returns another value than
recorded.

The split's own Python still ran first: the batch sized and sliced into chunks, its
verdict looked up, each chunk's geometry checked, the thread count read twice, the
runner's arrays made: 0.4-0.45 ms of MobileNetV2's 8 ms batch-8 run after the other
engines of bench/simulator.py ran. Once a batch's chunks went through :class:`FastChunks`,
:class:`FastBatch` holds that call for the whole batch's geometry, as
:class:`~simulator.runtime.fast.FastRun` does for a plan: a run is the batch's outputs
allocated and one ctypes call, ``qp_run_batch_np`` (csrc/qnpy.c), given the inputs' and
outputs' object addresses, which checks the batch against the geometry in numpy's array
struct and the thread count against the runner's, then runs the chunks. It steps aside
where the split would decide otherwise (another geometry, another thread count) and where
:class:`FastChunks` would.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np

from simulator.runtime import native
from simulator.runtime.fast import FastRun, address, geometry, hold, pointers, readable, spec
from simulator.runtime.replay import unshared_storage


def _int64s(values) -> ctypes.Array:
    values = list(values)
    return (ctypes.c_int64 * max(len(values), 1))(*values)


@dataclass(frozen=True, eq=False)
class FastChunks:
    """The chunks of one geometry on the fast runs ``runs`` (the owner's first)."""

    runs: tuple[FastRun, ...]
    outs: tuple[tuple[str, tuple, np.dtype], ...]  # per output: name, a chunk's shape, dtype
    plans: ctypes.Array  # each run's plan array, by address
    out_src: ctypes.Array  # [run][output]: where that run's plan leaves the output
    out_bytes: ctypes.Array  # per output: bytes a chunk

    @classmethod
    def build(cls, runs: list[FastRun], chunk: dict) -> FastChunks | None:
        """The chunk runner of ``runs`` for chunks like ``chunk`` (its inputs by name), or
        None: a run that does not take them, or an output that is not a contiguous view
        with the samples first, alike in every run."""
        names = runs[0].names
        if any(r.names != names or pointers([chunk.get(k) for k in names], r.key) is None
               for r in runs):  # fmt: skip
            return None
        first = runs[0].outs
        outs = tuple((k, v.shape, v.dtype) for k, v in first.items())
        for r in runs:
            views = [r.outs.get(k) for k, _, _ in outs]
            if any(v is None or not v.flags.c_contiguous or v.ndim == 0 for v in views):
                return None
            if [(v.shape, v.dtype) for v in views] != [(s, d) for _, s, d in outs]:
                return None
        plans = _int64s(ctypes.addressof(r.plan) for r in runs)
        out_src = _int64s(address(r.outs[k]) for r in runs for k, _, _ in outs)
        out_bytes = _int64s(first[k].nbytes for k, _, _ in outs)
        return cls(tuple(runs), outs, plans, out_src, out_bytes)

    def run(self, parts: list[dict], n: int, timed: bool):
        """``(outputs, seconds)`` of the chunks ``parts`` (consecutive slices of the batch's
        inputs) on ``n`` threads, outputs concatenated in order and ``seconds`` the owner's
        plan's per instruction summed over the chunks it ran (None untimed); None when the
        runner does not take them (module docstring)."""
        names, first, lib = self.runs[0].names, self.runs[0], native.library()
        base = pointers([parts[0].get(k) for k in names], first.key)
        if base is None or lib is not first.lib or not self._unshared():
            return None
        step = [address(parts[1][k]) - b for k, b in zip(names, base, strict=True)]
        last = [address(parts[-1][k]) for k in names]
        if last != [b + (len(parts) - 1) * s for b, s in zip(base, step, strict=True)]:
            return None  # not consecutive slices of one batch
        total = len(parts) * self.outs[0][1][0]
        outputs = {k: np.empty((total, *shape[1:]), dtype) for k, shape, dtype in self.outs}
        groups = first.frozen.slots.seconds.numel()
        seconds = np.zeros(groups) if timed else None
        done = lib.qp_run_chunks(
            len(self.runs), self.plans, len(parts), n, len(names), _int64s(base), _int64s(step),
            len(self.outs), self.out_src, self.out_bytes,
            _int64s(address(outputs[k]) for k, _, _ in self.outs), groups,
            None if seconds is None else seconds.ctypes.data,
        )  # fmt: skip
        return (outputs, seconds) if done == 1 else None

    def _unshared(self) -> bool:
        return all(unshared_storage(s) for r in self.runs for s in r.watched)


@dataclass(frozen=True, eq=False)
class FastBatch:
    """:class:`FastChunks`' call for one whole-batch geometry, straight from numpy (module
    docstring)."""

    chunks: FastChunks
    nchunks: int
    spec: ctypes.Array  # qp_run_batch_np's input spec (fast.spec()); addresses set per run
    objects: tuple[tuple[int, str], ...]  # (slot in spec, input name) per input
    outs: tuple[tuple[str, tuple, np.dtype], ...]  # per output: name, the batch's shape, dtype
    out_objects: ctypes.Array  # the outputs' object addresses, set per run
    job: ctypes.Array  # the rest of qp_run_batch_np's arguments
    seconds: np.ndarray  # the owner's seconds per instruction group, summed over its chunks
    key: tuple  # geometry() of the batch (keeps its dtype objects alive)
    keep: tuple  # the ctypes arrays the job points to

    @classmethod
    def build(cls, chunks: FastChunks, inputs: dict, parts: list[dict]) -> FastBatch | None:
        """The call for batches like ``inputs`` (split into ``parts``, consecutive slices
        that ``chunks`` just ran), or None: inputs that are not writeable numpy arrays or
        that the C side does not read as Python does."""
        first, lib = chunks.runs[0], native.library()
        xs = [inputs.get(k) for k in first.names]
        key = geometry(xs)
        if key is None or lib is not first.lib or not all(readable(x, lib) for x in xs):
            return None
        where, at = spec(key)
        steps = _int64s(address(parts[1][k]) - address(x) for k, x in zip(first.names, xs,
                                                                           strict=True))
        total = len(parts) * chunks.outs[0][1][0]
        outs = tuple((k, (total, *shape[1:]), dtype) for k, shape, dtype in chunks.outs)
        groups = first.frozen.slots.seconds.numel()
        seconds = np.zeros(max(groups, 1))
        job = _int64s([len(chunks.runs), ctypes.addressof(chunks.plans), len(parts), len(outs),
                       ctypes.addressof(steps), ctypes.addressof(chunks.out_src),
                       ctypes.addressof(chunks.out_bytes), groups, seconds.ctypes.data])  # fmt: skip
        return cls(chunks, len(parts), where, tuple(zip(at, first.names, strict=True)), outs,
                   _int64s([0] * len(outs)), job, seconds, key, (steps,))  # fmt: skip

    def run(self, inputs: dict, timed: bool) -> dict[str, np.ndarray] | None:
        """The batch's outputs (the caller's own arrays), or None when this call does not
        take ``inputs`` (module docstring). ``timed``: the owner's seconds kept
        (:meth:`timings`)."""
        held = hold(self.spec, self.objects, inputs)
        first = self.chunks.runs[0]
        if native.library() is not first.lib or not self.chunks._unshared():
            return None
        outputs = {k: np.empty(shape, dtype) for k, shape, dtype in self.outs}
        for m, (k, _, _) in enumerate(self.outs):
            self.out_objects[m] = id(outputs[k])
        done = first.lib.qp_run_batch_np(self.spec, self.out_objects, self.job, timed)
        del held  # the C side read the inputs by address: held through the call
        if done != 1:
            return None
        return outputs

    @property
    def path(self) -> str:
        """Executor.last_path of a run this call served."""
        size = self.chunks.outs[0][1][0]
        workers = len(self.chunks.runs)
        return f"frozen plan, batch split: {self.nchunks} chunks of {size} on {workers} threads"

    def timings(self) -> list[tuple]:
        """``(instruction, op, seconds)`` of the owner's chunks in the last timed run."""
        return self.chunks.runs[0].frozen.slots.listed(self.seconds)

    def kept(self):
        """:meth:`timings` of the last run, as a call that a later run does not change."""
        return functools.partial(self.chunks.runs[0].frozen.slots.listed, self.seconds.copy())
