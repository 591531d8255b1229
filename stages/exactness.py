"""A compiled program against quantized.onnx, bit for bit, on the path production runs.

Both chains call :func:`check_exact` once the program is written: compile (QAT chain) and
hbm (PTQ chain). It runs quantized.onnx's reference evaluator (``run_integer``) once on the
probe samples, then feeds the same samples five times to one fresh
:class:`~simulator.runtime.executor.Executor`, exactly as the evaluation feeds its batches
(:data:`RUNS`): the first runs execute each instruction's kernel while the replays learn
(:mod:`simulator.runtime.replay`), the third is served by the replays, the fourth is recorded and
the fifth is the frozen plan (:mod:`simulator.runtime.frozen`), the path that gives the
stages' metrics. Each run's model outputs must equal quantized.onnx's outputs, and on the
three capture runs every layer the program holds (``program.captures``) must equal
quantized.onnx's integers.

The probe batch is not the evaluation's: a replay and the frozen plan hold for one input
geometry, so the executor that gives the stage's metrics learns them again on the
evaluation's batches. :func:`check_evaluation` therefore checks that executor itself,
before it evaluates, on the geometries the evaluation feeds (:func:`batch_ranges`): its
first batch through the same five runs, ending in the frozen plan every later batch of
that size runs, and its last batch when the split does not divide into whole batches
(another geometry, which runs the kernels). Every run's outputs must equal the reference's
on that batch: quantized.onnx's (compile, hbm), or for board_sim (and the PTQ chain's
board), whose board.hbm has no ONNX twin, the same program run instruction by instruction
by a fresh Executor. The runs are listed in debug/bit_exact.txt and debug/board_exact.txt.

Layers the program names but the reference lacks are an error, never skipped: a captured
layer, or a layer id of the debug map (``Instruction.layer_ids``), missing from
quantized.onnx's layers.json means the program and its reference disagree, so nothing
could be proven. Reference layers the program no longer holds (fused into another
instruction, such as a conv's int32 accumulator) are not compared; they are listed in
``debug/bit_exact.txt`` (:meth:`Exactness.render`), as is which path served each run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from schemas.errors import StageError
from simulator.program.isa import Program
from simulator.runtime.executor import Executor
from stages.convert.graph import _layer_id
from stages.convert.stage import run_integer

RUNS = (True, True, True, False, False)
"""Capture flag of each run: kernels (replays learn), kernels (replays checked and
adopted), replays, recorded for the frozen plan, frozen plan."""
HINT = "this is a compiler or simulator bug: keep the run and report it"


@dataclass(frozen=True)
class Exactness:
    """What :func:`check_exact` proved equal (it raises on the first difference)."""

    layers: tuple[str, ...]  # layers compared on every capture run
    outputs: tuple[str, ...]  # model outputs compared on every run
    not_held: tuple[str, ...]  # reference layers the program no longer holds (fused)
    paths: tuple[str, ...]  # how each run executed (Executor.last_path)
    samples: int
    evaluation: tuple[tuple[int, str], ...] = ()  # (batch size, path): check_evaluation

    def render(self) -> str:
        """``debug/bit_exact.txt``."""
        runs = ", ".join(f"{i + 1}: {p}" for i, p in enumerate(self.paths))
        return "\n".join([
            f"# program vs quantized.onnx on {self.samples} probe samples: all equal",
            f"runs: {runs}",
            f"outputs compared on every run: {', '.join(self.outputs)}",
            f"layers compared on runs 1-3: {', '.join(self.layers) or '-'}",
            f"not held by the program (fused, not compared): {', '.join(self.not_held) or '-'}",
            *([render_runs(self.evaluation)] if self.evaluation else []),
        ]) + "\n"  # fmt: skip


def check_exact(
    program: Program, run_root: Path, quantized, x: np.ndarray | tuple, stage: str
) -> Exactness:
    """Prove ``program`` equals quantized.onnx (``quantized``: an artifact with
    ``onnx_file`` and ``layers_file``) on the samples ``x`` through every execution path;
    an :class:`Exactness`, or a StageError (``where`` = ``stage``) naming the first layer
    or output that differs and the path that produced it."""
    ref_outs, ref = run_integer(run_root, quantized, x)
    islands = set(getattr(quantized, "float_ops", ()))
    _check_known(program, ref, stage, islands | _unquantized(run_root / quantized.onnx_file, ref))
    if len(ref_outs) != len(program.outputs):
        raise StageError(f"the program has {len(program.outputs)} outputs, quantized.onnx "
                         f"{len(ref_outs)}", where=stage, hint=HINT)  # fmt: skip
    want = dict(zip(program.outputs, ref_outs, strict=True))
    xs = x if isinstance(x, tuple) else (x,)
    executor, feed = Executor(program), dict(zip(program.inputs, xs, strict=True))
    by = _Against(stage)
    paths = tuple(_run(executor, feed, capture, want, ref, by) for capture in RUNS)
    return Exactness(
        layers=tuple(program.captures),
        outputs=tuple(want),
        not_held=tuple(lid for lid in ref if lid not in program.captures),
        paths=paths,
        samples=len(xs[0]),
    )


def batch_ranges(n: int, batch_size: int) -> list[tuple[int, int]]:
    """The sample ranges of the batch geometries an evaluation of ``n`` samples feeds
    (:func:`stages.evaluate.collect`): its first batch, and its last one when ``n`` does
    not divide into whole batches."""
    ranges = [(0, min(batch_size, n))]
    if n > batch_size and n % batch_size:
        ranges.append((n - n % batch_size, n))
    return ranges


def check_evaluation(
    executor: Executor,
    feeds: list[dict],
    reference: Callable[[dict], list],
    stage: str,
    against: str = "quantized.onnx",
) -> tuple[tuple[int, str], ...]:
    """Check the executor that is about to give ``stage``'s metrics, on the evaluation's
    own batches (``feeds``, from :func:`batch_ranges`): the first fed once per entry of
    :data:`RUNS` (kernels, replays, recorded, frozen plan), every other one once (another
    geometry: the kernels, as the evaluation's last batch). Each run's outputs must equal
    ``reference(feed)`` (the outputs in program order; ``against`` names it); (batch
    size, path) per run, or a StageError naming the output, the path and the batch."""
    runs = []
    for k, feed in enumerate(feeds):
        want = dict(zip(executor.program.outputs, reference(feed), strict=True))
        n = len(next(iter(feed.values())))
        by = _Against(stage, against, f", the evaluation's batch of {n} samples")
        runs += [
            (n, _run(executor, feed, False, want, {}, by)) for _ in (RUNS if k == 0 else RUNS[:1])
        ]
    return tuple(runs)


def render_runs(runs: tuple[tuple[int, str], ...]) -> str:
    """One line: how each checked run of the evaluation's executor went."""
    text = ", ".join(f"{i + 1}: {p} ({n} samples)" for i, (n, p) in enumerate(runs))
    return f"outputs of the evaluation's own executor on its batch geometries: {text}"


def _unquantized(path: Path, ref: dict) -> set[str]:
    """Layers of quantized.onnx computing on integers that are no quantized tensor (token
    ids, a mask's sum: exact as they are, so not in layers.json); float islands included."""
    model = onnx.load(str(path), load_external_data=False)
    return {_layer_id(n) for n in model.graph.node} - set(ref)


def _check_known(program: Program, ref: dict, stage: str, islands: set[str] = frozenset()) -> None:
    """Every layer the program names (captures, debug map) is one quantized.onnx has. A
    multi-output instruction (a Split: shufflenet's chunk) names a layer that has no one
    tensor of its own; its outputs' layers are what layers.json holds. A float island
    (quantized.onnx's ``float_ops``: an op with no integer form, or a layout op on the
    float model input) has no integer tensor either: its instructions compute floats."""
    single = [i for i in program.instructions if len(i.outputs) == 1]
    named = {*program.captures, *(lid for i in single for lid in i.layer_ids if lid not in islands)}
    unknown = sorted(named - set(ref))
    if unknown:
        raise StageError(
            f"the program names layers quantized.onnx's layers.json lacks: {unknown[:8]}",
            where=stage,
            hint="the program and quantized.onnx do not belong together: recompile from "
            "this run's quantized artifact",
        )


@dataclass(frozen=True)
class _Against:
    """What a run is compared with, for the error: the stage, the reference, the batch."""

    stage: str
    reference: str = "quantized.onnx"
    batch: str = ""  # ", the evaluation's batch of N samples" (check_evaluation)


def _run(executor: Executor, feed: dict, capture: bool, want: dict, ref: dict, by: _Against):
    """One run compared with the reference; the path that served it. A function of its
    own so the captures (views of the replays' buffers) are released before the next run,
    which could not reuse those buffers otherwise."""
    outs, got = executor.run(feed, capture=capture)
    path = executor.last_path
    for lid, ints in got.items():  # layers first: the first to differ is the cause
        _same(ints, ref[lid][0], f"layer {lid}", path, by)
    for name, value in outs.items():
        _same(value, want[name], f"output {name}", path, by)
    return path


def _same(got: np.ndarray, want: np.ndarray, what: str, path: str, by: _Against) -> None:
    got, want = np.asarray(got), np.asarray(want)
    on = f"on the {path} path{by.batch}"
    if got.shape != want.shape:
        raise StageError(f"{what} has shape {got.shape} {on}, {by.reference} {want.shape}",
                         where=by.stage, hint=HINT)  # fmt: skip
    diff = got != want
    if diff.any():
        at = tuple(int(i) for i in np.argwhere(diff)[0])
        raise StageError(
            f"{what} differs from {by.reference} {on}: {int(diff.sum())} of "
            f"{diff.size} values, first at {at}: {got[at]} vs {want[at]}",
            where=by.stage,
            hint=HINT,
        )
