"""A batch run as chunks of samples, each through the plan of one small batch.

Why: at batch 8 a 224x224 model's activations (MobileNetV2's 112x112x96 int8 maps, 1.2 MB
a sample) no longer fit in a core's 2 MB L2, so every instruction streams them from
memory, and the kernels' two threads (then OpenMP's) met at a barrier after every instruction: the
simulator ran *fewer* frames a second at batch 8 than at batch 1 (MobileNetV2 335 -> 201,
ResNet-50 65.7 -> 51.0; bench/README.md, "Against onnxruntime's int8 path, third round").
Run as chunks of one or two samples, each chunk's activations stay in cache, and each of
:func:`simulator.runtime.threads.kernel_count` threads (a core each) runs whole chunks
through its own executor's frozen plan on one OpenMP thread, taking the next chunk when
done: nothing shared per instruction (data parallel). A worker on a core another process
holds still adds its share; ``QPARITY_THREADS=1`` runs the chunks in turn. Once the owner and
each twin have a fast run for the chunks (:class:`~simulator.runtime.fast.FastRun`), all
chunks go to the compiled kernels' pool in one call instead (:mod:`simulator.runtime.fast_chunks`):
the same plans, without a trip through Python per chunk.

The integers cannot change where every instruction computes each sample from that sample
alone, as the convolutions, requantizes and tables of a model with a free batch axis do
(their constants are per tensor or per channel). Not every program does: a Reshape may
fold the batch into another axis. So a batch is split only when

- every program input declares a shape whose first axis is free (``-1``, None or a name)
  and all inputs have the same number of samples, more than one chunk's;
- the inputs hold more than :data:`SAMPLE_BYTES` a sample (small inputs' batches stay in
  cache anyway, and each chunk costs a run's fixed overhead);
- the first batch of each geometry, run whole *and* split, gave the same outputs bit for
  bit (each with the batch as its first axis): a program that mixes samples fails that on
  any batch of distinct samples, and is then run whole on that geometry from then on.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial

import numpy as np

from schemas.errors import QparityError
from simulator.runtime import fast, threads
from simulator.runtime.fast import FastRun
from simulator.runtime.fast_chunks import FastBatch, FastChunks

SAMPLE_BYTES = 64 << 10
"""Bytes of program input a sample must exceed for its batch to run split: a 224x224x3
float32 frame is 588 KB; the digits example's 8x8 frames (256 B) and the transformer's
token rows stay whole (measured in bench/README.md, fourth round)."""
CHUNK_BYTES = 2 << 20
"""Input bytes a chunk may hold: the chunk size is the largest divisor of the batch within
it (at least 1 sample), so every chunk has one geometry and one frozen plan. 2 MB takes two
224x224x3 float32 frames: at batch 8 on 2 threads, chunks of 2 ran MobileNetV2 at 311 fps,
ResNet-50 at 76 fps, against 270 and 63 for chunks of 1 and 153 and 39 whole (medians,
loaded host; bench/README.md, fourth round)."""

_POOL: list[tuple[int, ThreadPoolExecutor]] = []  # (threads, pool), shared by every executor
_POOL_LOCK = threading.Lock()


def chunk_size(program_inputs: dict[str, dict], inputs: dict[str, np.ndarray]) -> int | None:
    """Samples per chunk for a batch run of ``inputs``, or None when it runs whole (the
    first two conditions of the module docstring)."""
    sizes = set()
    for name, spec in program_inputs.items():
        shape, x = spec.get("shape"), inputs.get(name)
        if x is None or not shape or isinstance(shape[0], int) and shape[0] >= 0:
            return None
        x = np.asarray(x)
        if x.ndim == 0:
            return None
        sizes.add(len(x))
    if len(sizes) != 1:
        return None
    n = sizes.pop()
    per_sample = sum(np.asarray(inputs[k]).nbytes for k in program_inputs) // max(n, 1)
    if per_sample <= SAMPLE_BYTES:
        return None
    fit = max(1, CHUNK_BYTES // per_sample)
    c = max(d for d in range(1, min(fit, n) + 1) if n % d == 0)
    return c if c < n else None


def geometry(inputs: dict[str, np.ndarray]) -> tuple:
    """What a split verdict is kept for: each input's name, shape and dtype."""
    return tuple(
        (k, np.asarray(v).shape, np.asarray(v).dtype.str) for k, v in sorted(inputs.items())
    )


def same_outputs(a: dict[str, np.ndarray], b: dict[str, np.ndarray], n: int) -> bool:
    """Bit for bit the same outputs, each with ``n`` samples on its first axis."""
    if a.keys() != b.keys():
        return False
    return all(
        x.ndim > 0 and len(x) == n and x.dtype == b[k].dtype and x.shape == b[k].shape
        and x.tobytes() == b[k].tobytes()
        for k, x in a.items()
    )  # fmt: skip


class BatchSplit:
    """An :class:`~simulator.runtime.executor.Executor`'s batch split (module docstring).
    ``owner`` runs chunks on the calling thread; its twins (executors of the same program
    sharing its constants, each with its own replays and plan) on pool threads."""

    def __init__(self, owner) -> None:
        self.owner = owner
        self.twins: list = []
        self.verdict: dict[tuple, bool] = {}  # geometry -> the split gave the whole's outputs
        self.native: dict[tuple, FastChunks | bool] = {}  # the fast runs' chunk runner
        self.last = ""  # Executor.last_path of the last run that came here

    def run(self, inputs: dict[str, np.ndarray], n_threads: int) -> dict | None:
        """The outputs of a batch run as chunks, or None when it runs whole."""
        c = chunk_size(self.owner.program.inputs, inputs)
        key = None if c is None else geometry(inputs)
        if c is None or self.verdict.get(key) is False:
            return None
        names = list(self.owner.program.inputs)
        n = len(np.asarray(inputs[names[0]]))
        parts = [{k: np.asarray(inputs[k])[i : i + c] for k in names} for i in range(0, n, c)]
        if key in self.verdict:
            return self._chunks(parts, n_threads, whole=inputs)
        # on a throwaway twin: a replay, once adopted, serves one geometry (the chunks')
        spare = self.owner.twin()
        whole, whole_path = spare.run_batch(inputs, n_threads)[0], spare.last_path
        try:  # in turn: the twins start once the shared constants' derived objects exist
            split = self._chunks(parts, n_threads, workers=1)
        except QparityError:
            split = None
        self.verdict[key] = split is not None and same_outputs(split, whole, n)
        if not self.verdict[key]:
            self.last = f"{whole_path} (whole: split into chunks, this batch gave other outputs)"
        return split if self.verdict[key] else whole

    def _chunks(self, parts: list[dict], n_threads: int, workers: int = 0,
                whole: dict | None = None) -> dict:  # fmt: skip
        """Every chunk's outputs, concatenated in order: on ``workers`` (default
        :func:`~simulator.runtime.threads.kernel_count`, at most one a chunk) workers of one
        OpenMP thread each, every worker taking the next chunk; one worker runs them in
        turn on ``n_threads``. ``whole``: the batch's inputs, once its split is proven."""
        workers = workers or min(threads.kernel_count(), len(parts))
        while len(self.twins) < workers - 1:
            self.twins.append(self.owner.twin())
        if workers > 1 and (got := self._native(parts, workers, whole)) is not None:
            return got
        runs: list = [None] * len(parts)  # (outputs, executor's path, owner's timings)
        todo = itertools.count()  # next() is atomic under the GIL
        each = n_threads if workers == 1 else 1
        futures = [_pool(workers - 1).submit(self._worker, t, parts, runs, todo, each)
                   for t in self.twins[: workers - 1]]  # fmt: skip
        try:
            self._worker(self.owner, parts, runs, todo, each)
        finally:  # a twin is never left running into the next run, even after an error
            wait(futures)
        for f in futures:
            f.result()
        self._sum_timings([t for _, _, t in runs if t is not None])
        how = "in turn" if workers == 1 else f"on {workers} threads"
        size = len(next(iter(parts[0].values())))
        paths = " / ".join(sorted({p for _, p, _ in runs}))
        self.last = f"{paths}, batch split: {len(parts)} chunks of {size} {how}"
        return {k: np.concatenate([o[k] for o, _, _ in runs]) for k in runs[0][0]}

    def _native(self, parts: list[dict], workers: int, whole: dict | None) -> dict | None:
        """Every chunk's outputs from one call (:mod:`simulator.runtime.fast_chunks`) once
        the owner and its twins all have a fast run for the chunks, else None. After it ran
        on ``whole`` (a batch whose split is proven), the owner's runs of that batch's
        geometry take the call straight from numpy (``FastBatch``)."""
        executors = [self.owner, *self.twins[: workers - 1]]
        runs = [ex._fast for ex in executors]
        if not all(isinstance(r, FastRun) for r in runs):
            return None
        key = tuple(map(id, runs))
        if key not in self.native:
            self.native[key] = FastChunks.build(runs, parts[0]) or False
        chunks = self.native[key]
        got = chunks.run(parts, workers, self.owner.timed) if chunks else None
        if got is None:
            return None
        outputs, seconds = got
        batch = self.owner._batch
        if whole is not None and (batch is None or batch.key != fast.geometry(
                [whole.get(k) for k in runs[0].names])):  # fmt: skip
            self.owner._batch = FastBatch.build(chunks, whole, parts)
        if seconds is not None:
            self.owner._timed_by(_Summed([partial(runs[0].frozen.slots.listed, seconds)]))
        size = len(next(iter(parts[0].values())))
        self.last = f"frozen plan, batch split: {len(parts)} chunks of {size} on {workers} threads"
        return outputs

    def _worker(self, ex, parts: list[dict], runs: list, todo, n_threads: int) -> None:
        """Run chunks on executor ``ex`` (``n_threads`` OpenMP threads) until none is left."""
        for j in todo:
            if j >= len(parts):
                return
            outs = ex.run_batch(parts[j], n_threads)[0]
            timed = ex.kept_timings() if ex is self.owner else None
            runs[j] = (outs, ex.last_path, timed)

    def _sum_timings(self, runs: list) -> None:
        """The owner's :attr:`timings`: each instruction's seconds summed over the chunks it
        ran itself (the calling thread's share of the batch), summed when read."""
        self.owner._timed_by(_Summed(runs))


class _Summed:
    """Timings summed over chunks (``Executor.kept_timings()`` of each), built when read."""

    def __init__(self, runs: list) -> None:
        self.runs = runs

    def timings(self) -> list[tuple]:
        total: dict[tuple, float] = {}
        for run in self.runs:
            for i, op, s in run():
                total[i, op] = total.get((i, op), 0.0) + s
        return [(i, op, s) for (i, op), s in total.items()]

    def kept(self):
        return self.timings


def _pool(n: int) -> ThreadPoolExecutor:
    """A pool of at least ``n`` threads, shared by every executor of the process."""
    with _POOL_LOCK:
        if not _POOL or _POOL[0][0] < n:
            _POOL[:] = [(n, ThreadPoolExecutor(n, thread_name_prefix="qparity-split"))]
        return _POOL[0][1]
