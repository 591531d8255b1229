"""board_sim: the .hbm on the simulated board, fed the way the board is fed.

With ``stages.board_sim.runtime_format: featuremap`` the evaluation inputs go in as they
are (model.hbm). Otherwise the dataset's camera frames (``camera_evaluation``) are encoded
as the camera delivers them (nv12, yuv444, rgb, bgr, gray) and board.hbm takes them through
the board's input path. Training on RGB and deploying on nv12 is the classic user-side
divergence: it shows here as a metric difference against compile.

Before it evaluates, the executor is checked on the evaluation's batch geometries: its
replays and frozen plan must give what the program gives run instruction by instruction
(:func:`stages.exactness.check_evaluation`; debug/board_exact.txt).
"""

from __future__ import annotations

import numpy as np

from schemas.artifacts import BoardRun, HbmModel
from schemas.errors import StageError
from simulator.program import hbm
from simulator.runtime.executor import Executor
from stages.board_program import camera_inputs
from stages.context import RunContext
from stages.evaluate import stage_metrics
from stages.exactness import batch_ranges, check_evaluation, render_runs
from stages.faults import inject_board, record_board
from stages.registry_types import StageCall


def board_sim(upstream: HbmModel, ctx: RunContext, call: StageCall) -> BoardRun:
    """Measure the program on the simulated board (stages.evaluate)."""
    cfg = ctx.spec.stages.board_sim
    record_board(ctx)
    if cfg.runtime_format == "featuremap":
        executor, split = Executor(hbm.load(ctx.run.path(upstream.hbm_file))), ctx.evaluation
    else:
        if "camera" not in ctx.splits:
            raise StageError(
                "the dataset has no camera frames",
                where="data.dataset",
                hint='return "camera_evaluation": uint8 RGB N x H x W x 3 frames, '
                "or set stages.board_sim.runtime_format: featuremap",
            )
        executor = Executor(hbm.load(ctx.run.path(upstream.board_file)))
        split = ctx.splits["camera"]
    _check_paths(executor, split, cfg, ctx)
    metrics = stage_metrics(
        ctx,
        "board_sim",
        lambda *xs: _board_out(executor, tuple(t.numpy() for t in xs), cfg, ctx),
        split,
        graph=True,
    )
    return call.make(
        BoardRun,
        ctx.run,
        files=[],
        runtime_format=cfg.runtime_format,
        training_format=ctx.spec.data.input_format,
        metrics=metrics,
    )


def _check_paths(executor: Executor, split, cfg, ctx: RunContext) -> None:
    """The executor that gives board_sim's metrics, on the evaluation's batch geometries,
    against the same program run instruction by instruction by a fresh Executor (board.hbm
    has no ONNX twin; model.hbm was checked against quantized.onnx by compile): the
    replays and the frozen plan must not change a number (stages.exactness)."""
    ranges = batch_ranges(len(split), ctx.spec.data.batch_size)
    feeds = [_feed(executor, split.arrays(a, b), cfg, ctx) for a, b in ranges]
    kernels = lambda feed: list(Executor(executor.program).run(feed)[0].values())  # noqa: E731
    runs = check_evaluation(executor, feeds, kernels, "board_sim", "its kernels")
    ctx.write_debug("board_exact.txt", render_runs(runs) + "\n")


def _board_out(executor: Executor, x: tuple, cfg, ctx: RunContext) -> list[np.ndarray]:
    """The board's outputs (program order) for one batch of inputs (one array per program
    input) or camera frames (a 1-tuple)."""
    return list(executor.run(_feed(executor, x, cfg, ctx))[0].values())


def _feed(executor: Executor, x: np.ndarray, cfg, ctx: RunContext) -> dict[str, np.ndarray]:
    if cfg.runtime_format == "featuremap":
        return dict(zip(executor.program.inputs, x, strict=True))
    return camera_feed(ctx, x[0])


def camera_feed(ctx: RunContext, frames: np.ndarray) -> dict[str, np.ndarray]:
    """What the board's camera delivers for RGB ``frames`` (with board_sim's faults)."""
    cfg = ctx.spec.stages.board_sim
    frames, color = inject_board(ctx, frames, cfg.color)
    return camera_inputs(frames, cfg.runtime_format, color)
