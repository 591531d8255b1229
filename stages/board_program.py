"""The board's input path, inserted by compile in front of the model (board.hbm).

The featuremap QUANTIZE of the compiled model is replaced by what the board does with a
camera frame (docs/design.md, "Board input"):
1. PREPROCESS (simulator.arith.board_input.preprocess): nv12 -> YUV444 by nearest chroma
   upsampling, colour conversion to the training format if needed, minus 128 -> int8 NHWC;
2. LAYOUT Transpose to NCHW;
3. the mean/std normalization folded into a grouped 1x1 CONV (groups = channels) landing on
   the first layer's input scale ``s``: with ``w_c = 1/(std_c*s)`` and
   ``b_c = (128 - mean_c)/(std_c*s)`` (board_input.fold_mean_std),
   ``acc = 64*x + round(64*b_c/w_c)`` (int8 weight 64, int32 bias) and the requantize ratio
   ``w_c / 64``: ``q = round(((x + 128) - mean_c) / std_c / s)`` to 1/64 of a pixel.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from schemas.errors import SpecError, StageError
from schemas.spec import PipelineSpec
from simulator.arith.board_input import FOLD_WEIGHT, SUPPORTED, fold_mean_std, folded_bias
from simulator.arith.intmath import fixed_multiplier
from simulator.program.isa import Instruction, Op, Program

WEIGHT = FOLD_WEIGHT


def board_program(program: Program, spec: PipelineSpec) -> Program:
    """The program the board runs: camera frames in, the same model after its input."""
    cfg, data = spec.stages.board_sim, spec.data
    if data.input_format == "featuremap":
        raise SpecError(
            "a featuremap-trained model has no camera input path",
            where="stages.board_sim.runtime_format",
            hint="use runtime_format: featuremap, or state data.input_format",
        )
    if cfg.runtime_format not in SUPPORTED[data.input_format]:
        raise SpecError(
            f"a model trained on {data.input_format} cannot take {cfg.runtime_format} frames",
            where="stages.board_sim.runtime_format",
            hint=f"use one of {', '.join(sorted(SUPPORTED[data.input_format]))}, "
            "or state the training format in data.input_format",
        )
    first = program.instructions[0]
    if first.op is not Op.QUANTIZE:
        raise StageError(
            "the compiled model does not start with its input quantizer",
            where="compile",
            hint="this is a compiler bug: report it",
        )
    channels = int(next(iter(program.inputs.values()))["shape"][1])
    names = ("y", "uv") if cfg.runtime_format == "nv12" else ("camera",)
    conv, consts = _fold_conv(
        first, data, channels, spec.stages.convert.rounding or spec.quant.rounding
    )
    inputs = {n: {"dtype": "uint8", "format": cfg.runtime_format} for n in names}
    return dataclasses.replace(
        program,
        inputs=inputs,
        instructions=[
            *_camera_path(names, cfg, data.input_format),
            conv,
            *program.instructions[1:],
        ],
        constants={**program.constants, **consts},
    )


def _camera_path(names, cfg, training_format: str) -> list[Instruction]:
    """PREPROCESS (camera frame -> centered int8 NHWC) and the transpose to NCHW."""
    attrs = {
        "runtime_format": cfg.runtime_format,
        "color": cfg.color,
        "training_format": training_format,
    }
    return [
        Instruction(Op.PREPROCESS, names, ("board:centered",), (), attrs, ("board:input",)),
        Instruction(
            Op.LAYOUT,
            ("board:centered",),
            ("board:nchw",),
            (),
            {"op_type": "Transpose", "perm": [0, 3, 1, 2]},
            ("board:input",),
        ),
    ]


def _fold_conv(quantize: Instruction, data, channels: int, rounding: str):
    """The grouped 1x1 conv applying mean/std onto the first layer's input scale."""
    scale = float(quantize.attrs["scale"][0])
    mean = np.asarray(data.mean or [0.0] * channels, dtype=np.float64)
    std = np.asarray(data.std or [1.0] * channels, dtype=np.float64)
    if mean.size != channels or std.size != channels:
        raise SpecError(
            f"data.mean/std need {channels} values",
            where="data.mean",
            hint="one per input channel, in pixel units (0..255)",
        )
    w, b = fold_mean_std(mean, std, scale)
    w, b = np.asarray(w).reshape(-1), np.asarray(b).reshape(-1)
    mult, shift = fixed_multiplier(w / WEIGHT, 31, rounding)
    consts = {
        "board:weight": np.full((channels, 1, 1, 1), WEIGHT, np.int8),
        "board:bias": folded_bias(w, b),
        "board:mult": np.asarray(mult, np.int64),
        "board:shift": np.asarray(shift, np.int64),
    }
    attrs = {
        "strides": [1, 1],
        "pads": [0, 0, 0, 0],
        "dilations": [1, 1],
        "group": channels,
        "out_dtype": quantize.attrs["dtype"],
        "rounding": rounding,
        "relu": 0,
    }
    conv = Instruction(
        Op.CONV, ("board:nchw",), quantize.outputs, tuple(consts), attrs, ("board:normalize",)
    )
    return conv, consts


def camera_inputs(frames: np.ndarray, runtime_format: str, color: str) -> dict[str, np.ndarray]:
    """What the camera delivers for RGB frames (uint8 N x H x W x 3) in a runtime format."""
    from simulator.arith.board_input import rgb_to_yuv, to_nv12

    if runtime_format == "nv12":
        y, uv = to_nv12(rgb_to_yuv(frames, color))
        return {"y": y, "uv": uv}
    if runtime_format == "yuv444":
        return {"camera": rgb_to_yuv(frames, color)}
    if runtime_format == "bgr":
        return {"camera": np.ascontiguousarray(frames[..., ::-1])}
    if runtime_format == "gray":
        return {"camera": rgb_to_yuv(frames, color)[..., 0]}
    return {"camera": frames}
