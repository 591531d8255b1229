"""The vectorized executor of a :class:`~simulator.program.isa.Program`: whole-tensor torch kernels,
bit-identical to the reference evaluators (:mod:`simulator.arith.int_ops`, :mod:`simulator.arith.lut`,
:mod:`simulator.arith.composite`, :data:`simulator.arith.custom_ops.CUSTOM_OPS`).

Machine state:

- ``bufs``: buffer name -> torch tensor; int8/int16/int32 (int64 inside kernels only),
  float32 for a QUANTIZE input, a DEQUANTIZE or CPU output. Filled with the program inputs,
  then each instruction writes its ``outputs``; nothing is mutated in place, so a buffer
  may be a view (a transpose, a permuted conv output) of another.
- ``consts``: a :class:`~simulator.kernels.exec_ops.ConstPool` built once per Executor: the
  program's constants as torch tensors, plus derived objects decoded once (LUT / softmax
  / layernorm tables).
- :data:`KERNELS`: ``Op -> fn(instr, bufs, consts) -> [tensors]``, the view of the
  instruction table :data:`simulator.instructions.INSTRUCTIONS`. The kernels live in :mod:`simulator.kernels.exec_ops` (integer arithmetic), :mod:`simulator.kernels.exec_pool`
  (pools and reductions),
  :mod:`simulator.kernels.exec_table_ops` (tables, QUANTIZE / DEQUANTIZE, CPU, PREPROCESS) and
  :mod:`simulator.kernels.exec_layout` (LAYOUT); this module holds the table, the
  :class:`Executor` that runs a program, and the program checks.

Operands: an instruction's operand list is ``inputs`` (buffers) followed by ``consts``
(constant names, ``""`` for an absent optional one): exactly the quantized.onnx node's
inputs when its data inputs come first. ``attrs`` are the node's attributes. A CONV with
two inputs ``x, b`` is a fused conv + add (consts ``w, bias, mult, shift, ma, mb,
add_shift``; ``attrs`` out_dtype/rounding/relu are the add's): ``QAdd(QConv(x) as int32,
b)``, see :mod:`simulator.kernels.exec_conv`.

Speed without changing a number: nhwc convs run blocked with only the real channels and a
float64 epilogue (:mod:`simulator.kernels.exec_conv`, :mod:`simulator.kernels.exec_epilogue`), used only
where a static bound proves ``|v * m|`` below :func:`simulator.kernels.exec_kernels.exact_limit`
(2**53 half_even, 2**52 bpu_round; float32: 2**24 / 2**23); table ops
gather from dense tables of every input integer, LayerNorm and softmax run on row
statistics (:mod:`simulator.kernels.exec_dense`); reductions sum exactly in float
(:mod:`simulator.kernels.exec_pool`). Everything else, and every case the bounds do not cover,
keeps the int64 kernels. The hot instructions also have compiled forms
(:mod:`simulator.runtime.native`, simulator/README.md "Compiled kernels"), and a LAYOUT that only
re-views its input, and a kernel that is only compiled calls, are replayed from their first
runs (:mod:`simulator.runtime.replay`).

Layouts: ``attrs["layout"] == "nhwc"`` on CONV/ADD/REQUANT/CLIP/MAXPOOL/AVGPOOL/LUT means
its 4-D buffers are ``[N, H, W, C_pad]``; channels ``C..C_pad`` hold zeros. Conv weights
are then packed ``[O_pad, kh, kw, C_in_pad / group]`` int8 (plain: ONNX ``[O, C/g, kh,
kw]``); per-channel bias/mult/shift (and QAdd's ma/mb, flattened) run along the last axis,
padded with 0 (mult 0 keeps padding channels at 0). Axis attributes (REQUANT ``axis``)
keep their NCHW meaning and are mapped to NHWC. Conv with group > 1 is never padded.
After LUT and CLIP (which may map 0 to non-zero) the executor re-zeros padding channels
of an nhwc output whose :class:`~simulator.program.isa.Layout` says ``channels < channels_padded``.
Captures and outputs are converted back to NCHW with padding dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from schemas.errors import QparityError, SimulatorError
from simulator.instructions import kernels
from simulator.kernels.exec_layout import to_reference
from simulator.kernels.exec_ops import ConstPool, is_nhwc
from simulator.program.isa import Instruction, Op, Program
from simulator.runtime import native, threads
from simulator.runtime.fast import FastRun
from simulator.runtime.fast_chunks import FastBatch
from simulator.runtime.frozen import Frozen, freeze
from simulator.runtime.replay import Replays
from simulator.runtime.split import BatchSplit

KERNELS: dict[Op, Callable] = kernels()
"""Every :class:`Op` -> its whole-tensor kernel: the view of
:data:`simulator.instructions.INSTRUCTIONS` the executor runs (tests patch entries)."""
assert set(KERNELS) == set(Op), "every op has a kernel"
_REZERO = frozenset({Op.LUT, Op.CLIP})


class Executor:
    """Runs a :class:`Program` on torch tensors; see the module docstring for the state.

    ``Executor(program, timings=True)`` records ``(index, op, seconds)`` per instruction of
    the last run in :attr:`timings` (``None`` when off, the default).
    """

    def __init__(self, program: Program, timings: bool = False, consts: ConstPool | None = None):
        self.program = program
        _check_program(program)
        self.consts = consts or ConstPool(program.constants, program.layouts)
        self._timings: list[tuple[int, Op, float]] | None = [] if timings else None
        self._plan_times = None  # the frozen plan's Slots whose seconds are the last run's
        self.replays = Replays()  # how each instruction's next run skips its kernel
        self._frozen: Frozen | bool | None = None  # the whole-run plan; False: none to build
        self._fast: FastRun | bool | None = None  # the plan from numpy (fast.py); False: none
        self._batch: FastBatch | None = None  # a split batch's chunks from numpy (fast_chunks.py)
        self.split = BatchSplit(self)  # a batch as chunks of samples (simulator.runtime.split)
        self.last_path = ""  # how the last run executed (_path)

    @property
    def timings(self) -> list[tuple[int, Op, float]] | None:
        """``(index, op, seconds)`` per instruction of the last run, None when off. A run of
        the frozen plan leaves its seconds in the plan's array; the list is built on the
        first read after it, outside the timed run."""
        if self._plan_times is not None:
            self._timings = self._plan_times.timings()
            self._plan_times = None
        return self._timings

    @timings.setter
    def timings(self, value: list | None) -> None:
        self._timings, self._plan_times = value, None

    @property
    def timed(self) -> bool:
        """Whether runs keep their timings (``Executor(timings=True)``)."""
        return self._timings is not None  # a list, even while a plan's seconds wait to be read

    def _timed_by(self, source) -> None:
        """The last run's timings are ``source.timings()`` (when on), built when read: the
        plan's Slots, whose seconds it ran, or a batch split's sum over its chunks."""
        self._plan_times = source if self.timed else None

    def kept_timings(self) -> Callable[[], list] | None:
        """The last run's timings as a call that builds them, which later runs leave as
        they are (a copy of the plan's seconds, made into the list only when called); None
        when timings are off. A batch split keeps its chunks' this way, in the run."""
        if self._plan_times is not None:
            return self._plan_times.kept()
        listed = self._timings
        return None if listed is None else lambda: listed

    def twin(self) -> Executor:
        """Another executor of the same program sharing these constants, with replays and a
        plan of its own: a batch split's worker on another thread."""
        return Executor(self.program, consts=self.consts)

    def run(self, inputs: dict[str, np.ndarray], capture: bool = False):
        """(outputs by name, captures by layer id), numpy, in the reference layout.

        Outputs are the caller's own copies. Captures (``program.captures``: layer id ->
        buffer) only when ``capture``; without it the second dict is empty. Runs after the
        first ones come from replays and then from the frozen plan (module docstring of
        :mod:`simulator.runtime.replay`, :mod:`simulator.runtime.frozen`); ``capture`` runs instruction by
        instruction. A large batch may run as chunks of samples (:mod:`simulator.runtime.split`),
        never with ``capture``. :attr:`last_path` then says which path ran.
        """
        if not capture:  # the plan from numpy reads the thread count in C (fast.py)
            outputs = self._run_fast(inputs, 0)
            if outputs is not None:
                return outputs, {}
        n = threads.kernel_count()  # a bad QPARITY_THREADS is named before anything runs
        if not capture:
            outputs = self.split.run(inputs, n)
            if outputs is not None:
                self.last_path = self.split.last
                return outputs, {}
        return self._run_batch(inputs, n, capture)  # the fast run was tried above

    def _run_fast(self, inputs: dict[str, np.ndarray], n: int) -> dict | None:
        """The outputs from the plan run straight from numpy (:mod:`simulator.runtime.fast`) on
        ``n`` threads (0: :func:`threads.kernel_count`'s), or, with ``n`` 0, from the chunks
        of the last batch split (:class:`~simulator.runtime.fast_chunks.FastBatch`); None when
        neither takes these inputs."""
        if not n and self._batch is not None:
            outputs = self._batch.run(inputs, self.timed)
            if outputs is not None:
                self.last_path = self._batch.path
                self._timed_by(self._batch)
                return outputs
        outputs = self._fast.run(inputs, n, self.timed) if self._fast else None
        if outputs is not None:
            self.last_path = "frozen plan"
            self._timed_by(self._fast.frozen.slots)
        return outputs

    def run_batch(self, inputs: dict[str, np.ndarray], n: int, capture: bool = False):
        """:meth:`run` of the whole batch at once on ``n`` OpenMP threads (a batch split's
        chunks come here too)."""
        outputs = None if capture else self._run_fast(inputs, n)
        if outputs is not None:
            return outputs, {}
        return self._run_batch(inputs, n, capture)

    def _run_batch(self, inputs: dict[str, np.ndarray], n: int, capture: bool):
        """:meth:`run_batch` through torch: the kernels, the replays or the frozen plan; after
        the plan's first whole run, its fast run for these inputs' geometry is built."""
        bufs = self._load(inputs)
        with threads.kernel_threads(native.untraced(), n):
            frozen = None if capture else self._run_frozen(bufs)
            if frozen is None:
                self._run(bufs)
            else:
                bufs.update(frozen)
        self.last_path = self._path(frozen)
        # copies: a replay's buffers are then free again for the next run
        outputs = {name: self._export(bufs, name).copy() for name in self.program.outputs}
        captures = {}
        if capture:
            captures = {lid: self._export(bufs, b) for lid, b in self.program.captures.items()}
        if self._fast is None and not capture and self.last_path == "frozen plan":
            self._fast = FastRun.build(self._frozen, self.program, inputs) or False
        return outputs, captures

    def _path(self, frozen: dict | None) -> str:
        """How a run executed: the frozen plan, every instruction replayed, or kernels."""
        if frozen is not None:
            return "frozen plan"
        n, served = len(self.program.instructions), self.replays.served
        return "replays" if served == n else f"kernels ({n - served} of {n} instructions)"

    def buffer_shapes(self, inputs: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        """Every buffer's shape (stored layout) after one run: what the cost model needs."""
        bufs = self._load(inputs)
        self._run(bufs)
        return {name: tuple(t.shape) for name, t in bufs.items()}

    def _load(self, inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Program inputs as tensors (declared dtype), checking names and static shapes."""
        missing = set(self.program.inputs) - set(inputs)
        if missing:
            raise SimulatorError(f"missing inputs {sorted(missing)}", where="Executor.run")
        bufs = {}
        for name, spec in self.program.inputs.items():
            x = np.asarray(inputs[name])
            want = spec.get("shape")
            if want is not None and not _shape_ok(x.shape, want):
                raise SimulatorError(f"input {name} has shape {x.shape}, expected {want}",
                                     where="Executor.run")  # fmt: skip
            dtype = spec.get("dtype")
            x = x.astype(dtype) if dtype and x.dtype != np.dtype(dtype) else x
            owned = x.flags.writeable and min(x.strides, default=0) >= 0  # torch takes these
            bufs[name] = torch.from_numpy(x if owned else x.copy())
        return bufs

    def _run_frozen(self, bufs: dict[str, torch.Tensor]) -> dict | None:
        """The program outputs from the frozen plan (:mod:`simulator.runtime.frozen`), or None."""
        if not isinstance(self._frozen, Frozen):
            return None
        outputs = self._frozen.run([bufs[n] for n in self.program.inputs], self.timed)
        if outputs is not None:
            self._timed_by(self._frozen.slots)
        return outputs

    def _run(self, bufs: dict[str, torch.Tensor]) -> None:
        """Execute every instruction in order, writing its outputs into ``bufs``; record
        the run for a frozen plan once the last run replayed every instruction."""
        if self.timed:
            self.timings = []
        n = len(self.program.instructions)
        recording = self._frozen is None and self.replays.served == n
        self.replays.record, self.replays.served = [] if recording else None, 0
        try:
            self._execute(bufs)
            if recording and self.replays.served == n:
                xs = [bufs[name] for name in self.program.inputs]
                outs = {name: bufs[name] for name in self.program.outputs}
                self._frozen = freeze(self.replays.record, xs, outs) or False
        finally:
            self.replays.record = None

    def _execute(self, bufs: dict[str, torch.Tensor]) -> None:
        """Each instruction from its replay or its kernel (``Replays.run``), in order."""
        consts = self.consts
        for i, instr in enumerate(self.program.instructions):
            t0 = time.perf_counter()
            try:
                xs = [bufs[n] for n in instr.inputs]
                kernel = partial(KERNELS[instr.op], instr, bufs, consts)
                ys = self.replays.run(i, instr, xs, kernel)
            except QparityError as e:
                raise SimulatorError(e.what, where=_where(i, instr, e.where), hint=e.hint) from e
            except (RuntimeError, ValueError, IndexError, KeyError, TypeError) as e:
                raise SimulatorError(str(e), where=_where(i, instr)) from e
            if instr.op in _REZERO and is_nhwc(instr):
                ys = [
                    self._zero_padding(y, name) for y, name in zip(ys, instr.outputs, strict=True)
                ]
            bufs.update(zip(instr.outputs, ys, strict=True))
            if self._timings is not None:
                self._timings.append((i, instr.op, time.perf_counter() - t0))

    def _zero_padding(self, y: torch.Tensor, name: str) -> torch.Tensor:
        """Padding channels ``C..C_pad`` of an nhwc buffer set back to 0."""
        lay = self.program.layouts.get(name)
        if lay is None or y.ndim != 4 or not 0 < lay.channels < y.shape[3]:
            return y
        y = y.clone()
        y[..., lay.channels :] = 0
        return y

    def _export(self, bufs: dict[str, torch.Tensor], name: str) -> np.ndarray:
        """Buffer ``name`` in the reference layout (NCHW, padding dropped), as numpy."""
        return to_reference(bufs[name], self.program.layouts.get(name)).numpy()

    def timings_by_op(self) -> dict[str, float]:
        """Seconds per op kind over the last run (empty when timings are off)."""
        out: dict[str, float] = {}
        for _, op, sec in self.timings or []:
            out[op.value] = out.get(op.value, 0.0) + sec
        return out


def _where(i: int, instr: Instruction, inner: str | None = None) -> str:
    ids = ",".join(instr.layer_ids) or "-"
    return f"instruction {i} ({instr.op.value}, layers {ids})" + (f": {inner}" if inner else "")


def _shape_ok(shape: tuple[int, ...], want) -> bool:
    """Static dims must match; None, strings and negative dims are free."""
    if len(shape) != len(want):
        return False
    return all(not isinstance(w, int) or w < 0 or w == s for s, w in zip(shape, want, strict=True))


def _check_program(program: Program) -> None:
    """Every op known, every buffer defined before use, every constant present."""
    defined = set(program.inputs)
    for i, instr in enumerate(program.instructions):
        if instr.op not in KERNELS:
            raise SimulatorError(f"unknown op {instr.op!r}", where=f"instruction {i}")
        undefined = [n for n in instr.inputs if n not in defined]
        absent = [c for c in instr.consts if c and c not in program.constants]
        if undefined or absent:
            raise SimulatorError(f"undefined buffers {undefined} / constants {absent}",
                                 where=_where(i, instr), hint="check the program's order")  # fmt: skip
        defined.update(instr.outputs)
    lost = [b for b in [*program.outputs, *program.captures.values()] if b not in defined]
    if lost:
        raise SimulatorError(f"outputs/captures {lost} are never written", where="program")
