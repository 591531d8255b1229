"""The colour example data: 16x16 colour digits whose class hangs on a fine chroma mosaic.

Each frame is a scikit-learn digit (8x8, upsampled 2x by nearest to 16x16) drawn on a dark
grey background. Every digit pixel becomes a 2x2 cell whose stroke is tinted with two
isoluminant hues (same Y, opposite chroma): the top-left pixel of the cell in one hue, the
other three in the other. ``kind 0``: top-left warm, the rest cool; ``kind 1``: top-left
cool, the rest warm. The label is ``digit + 10 * kind`` (20 classes).

Why it diverges: nv12 keeps chroma only at ``[::2, ::2]``, i.e. exactly the top-left pixel
of each cell, and upsamples it to the whole cell. A kind-0 stroke (three quarters cool in
RGB) reaches the board uniformly *warm*, and a kind-1 stroke uniformly *cool*: the opposite
of what an RGB-trained model learned. The information survives (warm vs cool), so a model
trained on what the board sees (`load(format="yuv444")`) is not hurt.

Per frame, seeded: background luma 16..64, stroke luma 110..170 (no RGB clipping), chroma radius 40..60,
hue angles jittered +-20 degrees around warm (red) and cool (cyan). Colours are drawn in
YUV (BT.601 full range) and stored as RGB uint8 camera frames.
"""

from __future__ import annotations

import numpy as np

from examples.digits.data import _read_digits, _stratified_eval_indices
from simulator.arith import board_input

EVALUATION_SIZE = 1000
SPLIT_SEED = 20240611
COLOUR_SEED = {"train": 11, "evaluation": 12}
TRAIN_DRAWS = 2
"""Each training digit appears TRAIN_DRAWS times with each kind (fresh colours each time)."""
FORMATS = ("rgb", "yuv444")
CAMERA_ATTRS = {"runtime_format": "nv12", "color": "bt601_full"}
"""How the board receives the frames: nv12, BT.601 full range."""


def _digit_split() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The digits example's 8x8 shapes (0..1 intensity) split 797 train / 1000 evaluation."""
    images, y = _read_digits()
    is_eval = np.zeros(len(y), dtype=bool)
    is_eval[_stratified_eval_indices(y, EVALUATION_SIZE, SPLIT_SEED)] = True
    unit = images / 16.0
    return {"train": (unit[~is_eval], y[~is_eval]), "evaluation": (unit[is_eval], y[is_eval])}


def _hue(rng: np.random.Generator, n: int, centre_deg: float, radius: np.ndarray) -> np.ndarray:
    """(n, 2) chroma offsets (U, V) at angle ``centre +- 20`` degrees and the given radius."""
    angle = np.deg2rad(centre_deg + rng.uniform(-20.0, 20.0, n))
    return radius[:, None] * np.stack([np.cos(angle), np.sin(angle)], axis=1)


def _render(shapes: np.ndarray, kinds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """RGB uint8 frames (N x 16 x 16 x 3) of the shapes (N x 8 x 8, 0..1) with the mosaic.

    Per pixel, with alpha the digit intensity: ``Y = bg + alpha * (fg - bg)``,
    ``(U, V) = 128 + alpha * chroma``, chroma = the minor hue at the cell's top-left pixel and
    the major hue elsewhere; then ``yuv_to_rgb`` (BT.601 full range).
    """
    n = len(shapes)
    alpha = shapes.repeat(2, axis=1).repeat(2, axis=2)[..., None]
    bg, fg = rng.uniform(16, 64, n), rng.uniform(110, 170, n)
    radius = rng.uniform(40, 60, n)
    warm, cool = _hue(rng, n, 110.0, radius), _hue(rng, n, 290.0, radius)
    minor = np.where(kinds[:, None] == 0, warm, cool)[:, None, None, :]
    major = np.where(kinds[:, None] == 0, cool, warm)[:, None, None, :]
    top_left = np.zeros((16, 16, 1), dtype=bool)
    top_left[::2, ::2] = True
    chroma = np.where(top_left, minor, major)
    luma = bg[:, None, None, None] + alpha * (fg - bg)[:, None, None, None]
    yuv = np.concatenate([luma, 128.0 + alpha * chroma], axis=-1)
    return board_input.yuv_to_rgb(np.clip(np.rint(yuv), 0, 255).astype(np.uint8))


def _frames(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(RGB uint8 frames, int64 labels) of a split; training repeats each digit per kind."""
    shapes, digits = _digit_split()[split]
    rng = np.random.default_rng(COLOUR_SEED[split])
    if split == "train":
        shapes = np.tile(shapes, (2 * TRAIN_DRAWS, 1, 1))
        digits = np.tile(digits, 2 * TRAIN_DRAWS)
        kinds = np.repeat(np.arange(2 * TRAIN_DRAWS) % 2, len(shapes) // (2 * TRAIN_DRAWS))
    else:
        kinds = rng.permutation(np.arange(len(shapes)) % 2)
    return _render(shapes, kinds, rng), (digits + 10 * kinds).astype(np.int64)


def camera_frames(split: str) -> np.ndarray:
    """The RGB uint8 camera frames (N x 16 x 16 x 3) of ``"train"`` or ``"evaluation"``."""
    return _frames(split)[0]


def labels(split: str) -> np.ndarray:
    """The int64 labels (``digit + 10 * kind``) of ``"train"`` or ``"evaluation"``."""
    return _frames(split)[1]


def to_nv12(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The camera's nv12 planes of RGB uint8 frames: ``to_nv12(rgb_to_yuv(frames))``."""
    return board_input.to_nv12(board_input.rgb_to_yuv(frames, CAMERA_ATTRS["color"]))


def to_training_format(frames: np.ndarray, format: str = "rgb") -> np.ndarray:
    """RGB uint8 frames -> float32 N x 3 x H x W model input in the training ``format``.

    ``rgb``: ``(v / 255 - 0.5) / 0.5`` in [-1, 1] (computed from the frames directly).
    ``yuv444``: the board's own path ``preprocess(to_nv12(frames), nv12 -> yuv444) / 128``
    (rgb -> yuv -> nv12 -> nearest YUV444 -> minus 128), in [-1, 127/128].
    """
    if format == "rgb":
        x = (frames.astype(np.float32) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    elif format == "yuv444":
        attrs = {**CAMERA_ATTRS, "training_format": "yuv444"}
        x = board_input.preprocess(to_nv12(frames), attrs).astype(np.float32) / np.float32(128)
    else:
        raise ValueError(f"unknown training format {format!r}; use one of {FORMATS}")
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32)


def load(format: str = "rgb") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return ``{"train": (x, y), "evaluation": (x, y), "camera_evaluation": frames}``.

    ``x`` float32 (N, 3, 16, 16) as `to_training_format` makes it; ``y`` int64 in 0..19.
    3188 training frames (797 digits x 2 kinds x 2 colour draws), 1000 evaluation frames
    (half of each kind); seeded and identical on every call.
    """
    out = {}
    for split in ("train", "evaluation"):
        frames, y = _frames(split)
        out[split] = (to_training_format(frames, format), y)
        if split == "evaluation":
            out["camera_evaluation"] = frames  # what the board's camera sees (uint8 RGB)
    return out


def load_rgb() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`load` in RGB [-1, 1] (the spec's dataset factory for ``input_format: rgb``)."""
    return load("rgb")


def load_yuv444() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`load` in centered YUV444 / 128, through the board's nv12 camera path."""
    return load("yuv444")
