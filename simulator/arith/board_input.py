"""The board's camera input path: colour conversion, nv12, YUV444_128 and mean/std folding.

Frames reach the BPU as uint8 images in a *runtime* format (nv12, yuv444, rgb, bgr, gray);
the model was trained on a *training* format (rgb, bgr, yuv444 centered, gray). This module
turns the first into the int8 tensor the first layer receives (docs/design.md "Board input",
the vendor's public material). Everything is numpy, vectorized, NHWC.

Conventions:

- colour conversion (BT.601, full or video range), with ``M`` the 3x3 matrix and ``o`` the
  offset of :data:`COLOR_STANDARDS`: ``yuv = M @ rgb + o`` and its inverse
  ``rgb = M^-1 @ (yuv - o)``, both computed in float64, then rounded half to even and
  clipped to 0..255 (float-then-round, not an integer-exact fixed-point matrix);
- nv12: ``y = yuv[..., 0]`` (N x H x W) and ``uv = yuv[:, ::2, ::2, 1:]`` (N x H/2 x W/2 x 2):
  chroma is *picked* at even rows and columns, not averaged, as the reference converter
  does; back to YUV444 by nearest upsampling (each chroma sample fills its 2x2 block);
- YUV444_128 ("centered"): ``int8 = uint8 - 128``, so the range is -128..127.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from schemas.errors import SimulatorError
from simulator.arith.fixedpoint import round_half_even

COLOR_STANDARDS: dict[str, tuple[np.ndarray, np.ndarray]] = {
    "bt601_full": (
        np.array([[0.299, 0.587, 0.114], [-0.169, -0.331, 0.5], [0.5, -0.419, -0.081]]),
        np.array([0.0, 128.0, 128.0]),
    ),
    "bt601_video": (
        np.array([[0.257, 0.504, 0.098], [-0.148, -0.291, 0.439], [0.439, -0.368, -0.071]]),
        np.array([16.0, 128.0, 128.0]),
    ),
}
"""``standard -> (M, o)`` with ``[Y, U, V] = M @ [R, G, B] + o`` (the formulas of
docs/design.md "Board input")."""

RUNTIME_FORMATS = ("nv12", "yuv444", "rgb", "bgr", "gray")
TRAINING_FORMATS = ("rgb", "bgr", "yuv444", "gray", "featuremap")
SUPPORTED: dict[str, frozenset[str]] = {
    "rgb": frozenset({"nv12", "yuv444", "rgb", "bgr"}),
    "bgr": frozenset({"nv12", "yuv444", "rgb", "bgr"}),
    "yuv444": frozenset({"nv12", "yuv444"}),
    "gray": frozenset({"nv12", "yuv444", "gray"}),
    "featuremap": frozenset(),
}
"""``training format -> runtime formats the board can feed it`` (featuremap: none, it is
quantized by the QUANTIZE instruction, not by the camera path)."""


def _standard(standard: str) -> tuple[np.ndarray, np.ndarray]:
    """``(M, o)`` of a colour standard, or SimulatorError naming the known ones."""
    try:
        return COLOR_STANDARDS[standard]
    except KeyError:
        raise SimulatorError(
            f"unknown colour standard {standard!r}",
            where="board_input.color",
            hint=f"use one of {', '.join(COLOR_STANDARDS)}",
        ) from None


def _check_uint8(x: Any, name: str, shape: str, ndim: int, last: int | None) -> np.ndarray:
    """``x`` as a uint8 array of ``ndim`` dims (last dim ``last`` if given), else an error."""
    x = np.asarray(x)
    ok = x.dtype == np.uint8 and x.ndim == ndim and (last is None or x.shape[-1] == last)
    if not ok:
        raise SimulatorError(
            f"{name} must be uint8 {shape}, got {x.dtype} {tuple(x.shape)}",
            where=f"board_input.{name}",
            hint="pass camera frames as uint8 NHWC arrays",
        )
    return x


def _to_uint8(values: np.ndarray) -> np.ndarray:
    """``clip(round_half_even(v), 0, 255)`` as uint8."""
    return np.clip(round_half_even(values), 0, 255).astype(np.uint8)


def rgb_to_yuv(rgb: np.ndarray, standard: str = "bt601_full") -> np.ndarray:
    """RGB uint8 (N x H x W x 3) -> YUV uint8, same shape.

    FORMULA: ``[Y, U, V] = clip(round_half_even(M @ [R, G, B] + o), 0, 255)``; full range
    ``Y = 0.299R + 0.587G + 0.114B``, ``U = -0.169R - 0.331G + 0.5B + 128``,
    ``V = 0.5R - 0.419G - 0.081B + 128`` (video range: see :data:`COLOR_STANDARDS`).
    """
    rgb = _check_uint8(rgb, "rgb", "N x H x W x 3", 4, 3)
    matrix, offset = _standard(standard)
    return _to_uint8(rgb.astype(np.float64) @ matrix.T + offset)


def yuv_to_rgb(yuv: np.ndarray, standard: str = "bt601_full") -> np.ndarray:
    """YUV uint8 (N x H x W x 3) -> RGB uint8: the exact inverse matrix, then round.

    FORMULA: ``[R, G, B] = clip(round_half_even(M^-1 @ ([Y, U, V] - o)), 0, 255)`` with
    ``M^-1`` the float64 inverse of the standard's matrix (so ``yuv_to_rgb(rgb_to_yuv(x))``
    differs from ``x`` only by the two roundings and the clip).
    """
    yuv = _check_uint8(yuv, "yuv", "N x H x W x 3", 4, 3)
    matrix, offset = _standard(standard)
    return _to_uint8((yuv.astype(np.float64) - offset) @ np.linalg.inv(matrix).T)


def _check_even(h: int, w: int, name: str) -> None:
    """nv12 needs an even height and width (chroma is stored at half size)."""
    if h % 2 or w % 2:
        raise SimulatorError(
            f"nv12 needs an even height and width, got {h} x {w}",
            where=f"board_input.{name}",
            hint="crop or pad the frame to even dimensions",
        )


def to_nv12(yuv444: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """YUV444 uint8 (N x H x W x 3) -> nv12 ``(y N x H x W, uv N x H/2 x W/2 x 2)``.

    FORMULA: ``y = yuv[..., 0]``; ``uv = yuv[:, ::2, ::2, 1:3]`` (the top-left sample of each
    2x2 block, no averaging, as the reference converter). H and W must be even.
    """
    yuv444 = _check_uint8(yuv444, "yuv444", "N x H x W x 3", 4, 3)
    _check_even(yuv444.shape[1], yuv444.shape[2], "to_nv12")
    y = np.ascontiguousarray(yuv444[..., 0])
    uv = np.ascontiguousarray(yuv444[:, ::2, ::2, 1:3])
    return y, uv


def nv12_to_yuv444(y: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """nv12 ``(y N x H x W, uv N x H/2 x W/2 x 2)`` -> YUV444 uint8 N x H x W x 3.

    FORMULA: ``yuv[n, i, j] = (y[n, i, j], uv[n, i // 2, j // 2, 0], uv[n, i // 2, j // 2, 1])``
    (nearest upsampling of chroma). H and W must be even and the planes must agree.
    """
    y = _check_uint8(y, "y", "N x H x W", 3, None)
    uv = _check_uint8(uv, "uv", "N x H/2 x W/2 x 2", 4, 2)
    n, h, w = y.shape
    _check_even(h, w, "nv12_to_yuv444")
    if uv.shape[:3] != (n, h // 2, w // 2):
        raise SimulatorError(
            f"uv plane {tuple(uv.shape)} does not match y plane {tuple(y.shape)}",
            where="board_input.nv12_to_yuv444",
            hint=f"uv must be {(n, h // 2, w // 2, 2)}",
        )
    chroma = uv.repeat(2, axis=1).repeat(2, axis=2)
    return np.concatenate([y[..., None], chroma], axis=-1)


def center(yuv444: np.ndarray) -> np.ndarray:
    """uint8 -> "YUV444_128" int8: ``x - 128`` (0 -> -128, 128 -> 0, 255 -> 127)."""
    x = np.asarray(yuv444)
    if x.dtype != np.uint8:
        raise SimulatorError(
            f"center expects uint8, got {x.dtype}",
            where="board_input.center",
            hint="center the uint8 camera frame, not a float or int8 tensor",
        )
    return (x.astype(np.int16) - 128).astype(np.int8)


def _attrs(attrs: Mapping[str, str]) -> tuple[str, str, str]:
    """Validated ``(runtime_format, training_format, color)``; color defaults to bt601_full."""
    runtime = attrs.get("runtime_format")
    training = attrs.get("training_format")
    color = attrs.get("color", "bt601_full")
    _standard(color)
    for key, value, known in (
        ("runtime_format", runtime, RUNTIME_FORMATS),
        ("training_format", training, TRAINING_FORMATS),
    ):
        if value not in known:
            raise SimulatorError(
                f"unknown {key} {value!r}",
                where=f"board_input.{key}",
                hint=f"use one of {', '.join(known)}",
            )
    if runtime not in SUPPORTED[training]:
        allowed = ", ".join(sorted(SUPPORTED[training])) or "none (use the QUANTIZE input)"
        raise SimulatorError(
            f"a model trained on {training} cannot take {runtime} frames",
            where="board_input.runtime_format",
            hint=f"runtime formats for {training}: {allowed}",
        )
    return runtime, training, color


def _runtime_frame(x: Any, runtime: str) -> np.ndarray:
    """The frame as uint8 NHWC: YUV444 for nv12/yuv444, RGB for rgb/bgr, 1 channel for gray."""
    if runtime == "nv12":
        if isinstance(x, Mapping):
            return nv12_to_yuv444(x["y"], x["uv"])
        if isinstance(x, tuple | list) and len(x) == 2:
            return nv12_to_yuv444(*x)
        raise SimulatorError(
            f"nv12 input must be a dict {{'y', 'uv'}} or a tuple (y, uv), got {type(x).__name__}",
            where="board_input.preprocess",
            hint="pass the two planes returned by to_nv12",
        )
    if runtime == "gray":
        x = np.asarray(x)
        return _check_uint8(x[..., None] if x.ndim == 3 else x, "gray", "N x H x W", 4, 1)
    frame = _check_uint8(x, runtime, "N x H x W x 3", 4, 3)
    return frame[..., ::-1] if runtime == "bgr" else frame


def preprocess(x: Any, attrs: Mapping[str, str]) -> np.ndarray:
    """The board's input path: a camera frame -> the int8 N x H x W x C first-layer input.

    ``attrs``: ``runtime_format`` (nv12 as ``{"y", "uv"}`` or ``(y, uv)``; yuv444, rgb, bgr
    uint8 N x H x W x 3; gray N x H x W), ``training_format``, ``color`` (default bt601_full).
    FORMULA, with ``yuv`` the YUV444 frame (nv12 upsampled by nearest):
    training yuv444: ``yuv - 128``; training gray: ``Y - 128``;
    training rgb/bgr from nv12/yuv444: ``yuv_to_rgb(yuv) - 128`` (the vendor's colour 1x1 conv,
    here float-then-round to the uint8 RGB grid), channel order as trained;
    training rgb/bgr from rgb/bgr: the frame, reordered, ``- 128``.
    """
    runtime, training, color = _attrs(attrs)
    frame = _runtime_frame(x, runtime)
    if training == "yuv444":
        return center(frame)
    if training == "gray":
        return center(frame[..., :1])
    rgb = yuv_to_rgb(frame, color) if runtime in ("nv12", "yuv444") else frame
    return center(np.ascontiguousarray(rgb[..., ::-1] if training == "bgr" else rgb))


def rounding_pixels(runtime: str, training: str, color: str = "bt601_full") -> float:
    """The most the path's roundings move a pixel of the centered frame against the frame
    the model was trained on, in whole pixels (uint8 units).

    FORMULA: 0 where the path only reorders channels or centers (training yuv444 or gray;
    rgb/bgr frames for an rgb/bgr model); for an rgb/bgr model behind nv12/yuv444 frames,
    the colour round trip ``floor(0.5 * max_i sum_j |M^-1_ij| + 0.5)`` (rgb -> yuv rounds
    Y, U, V by at most 0.5 each, ``M^-1`` spreads that, yuv -> rgb rounds once more): 1 for
    bt601_full, 2 for bt601_video. nv12's chroma subsampling is not a rounding: what it
    removes is a real difference from the training frames and may exceed this bound.
    """
    runtime, training, color = _attrs(
        {"runtime_format": runtime, "training_format": training, "color": color}
    )
    if training in ("yuv444", "gray") or runtime not in ("nv12", "yuv444"):
        return 0.0
    inverse = np.linalg.inv(_standard(color)[0])
    return float(np.floor(0.5 * np.abs(inverse).sum(axis=1).max() + 0.5))


FOLD_WEIGHT = 64
"""The int8 weight of the folded mean/std conv (stages/board_program.py): its int32 bias
holds ``FOLD_WEIGHT * bias / weight``, the mean to ``1 / FOLD_WEIGHT`` of a pixel."""


def folded_bias(weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The folded conv's int32 bias: ``round(FOLD_WEIGHT * bias_c / weight_c)`` (float32, as
    :func:`fold_mean_std` gives them; ``weight`` C x 1 x 1 x 1 or C)."""
    return np.round(FOLD_WEIGHT * bias / np.reshape(weight, -1)).astype(np.int32)


def fold_rounding_pixels(mean: Any, std: Any, in_scale: Any) -> np.ndarray:
    """Per channel, how far (in pixels) the folded conv's integer bias moves a pixel:
    ``|folded_bias - FOLD_WEIGHT * b / w| / FOLD_WEIGHT``, at most ``1 / (2 * FOLD_WEIGHT)``.
    One pixel is ``1 / (std_c * s)`` input steps: with an int16 input (s about
    ``255 / (std_c * 65535)``) this alone may move the input by two steps."""
    exact = FOLD_WEIGHT * (128.0 - np.atleast_1d(np.asarray(mean, dtype=np.float64)))
    return np.abs(folded_bias(*fold_mean_std(mean, std, in_scale)) - exact) / FOLD_WEIGHT


def fold_mean_std(mean: Any, std: Any, in_scale: Any) -> tuple[np.ndarray, np.ndarray]:
    """Weight (C x 1 x 1 x 1) and bias (C) of the grouped 1x1 conv (groups = C) that applies
    ``((x_int8 + 128) - mean) / std`` and lands on the first layer's input scale ``s``.

    FORMULA: ``weight_c = 1 / (std_c * s)``, ``bias_c = (128 - mean_c) / (std_c * s)``, so
    ``weight_c * x_c + bias_c = ((x_c + 128) - mean_c) / std_c / s``: the conv's output is
    the first layer's input in units of ``s`` (the board rounds and clips it to int8).
    ``mean``, ``std``, ``s`` are scalars or per-channel; e.g. RGB [-1, 1] training
    (``(v / 255 - 0.5) / 0.5``) is ``mean = std = 127.5``.
    """
    mean, std, scale = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in (mean, std, in_scale))
    )
    if mean.ndim != 1 or not (np.all(std > 0) and np.all(scale > 0)):
        raise SimulatorError(
            "mean, std and in_scale must be scalars or per-channel vectors, std and scale > 0",
            where="board_input.fold_mean_std",
            hint="pass one value per input channel",
        )
    weight = 1.0 / (std * scale)
    bias = (128.0 - mean) * weight
    return weight.reshape(-1, 1, 1, 1).astype(np.float32), bias.astype(np.float32)
