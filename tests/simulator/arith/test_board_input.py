"""Tests of the board's camera input path: BT.601, nv12, YUV444_128, preprocess, mean/std."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from schemas.errors import SimulatorError
from simulator.arith import board_input as bi

BLACK, WHITE, RED, GREEN, BLUE, GREY = (
    (0, 0, 0),
    (255, 255, 255),
    (255, 0, 0),
    (0, 255, 0),
    (0, 0, 255),
    (128, 128, 128),
)


def pixels(*colours) -> np.ndarray:
    """A 1 x 1 x K x 3 uint8 image of the given RGB colours."""
    return np.array([[colours]], dtype=np.uint8)


def frames(n=2, h=4, w=6, seed=0) -> np.ndarray:
    """Random uint8 N x H x W x 3 frames."""
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def test_bt601_full_hand_values() -> None:
    """Y = .299R+.587G+.114B, U/V offset 128, rounded half-even, clipped (red V=255.5->255)."""
    yuv = bi.rgb_to_yuv(pixels(BLACK, WHITE, RED, GREEN, BLUE, GREY), "bt601_full")
    # red: Y 76.245, U 84.905, V 255.5; green: 149.685, 43.595, 21.155; blue: 29.07, 255.5, 107.345
    expected = [
        [0, 128, 128],
        [255, 128, 128],
        [76, 85, 255],
        [150, 44, 21],
        [29, 255, 107],
        [128, 128, 128],
    ]
    assert yuv.dtype == np.uint8 and yuv[0, 0].tolist() == expected


def test_bt601_video_hand_values() -> None:
    """Video range: black -> (16,128,128), white -> (235,128,128), Y = .257R+.504G+.098B+16."""
    yuv = bi.rgb_to_yuv(pixels(BLACK, WHITE, RED, GREEN, BLUE), "bt601_video")
    # red: 81.535, 90.26, 239.945; green: 144.52, 53.795, 34.16; blue: 40.99, 239.945, 109.895
    expected = [[16, 128, 128], [235, 128, 128], [82, 90, 240], [145, 54, 34], [41, 240, 110]]
    assert yuv[0, 0].tolist() == expected


@pytest.mark.parametrize("standard", ["bt601_full", "bt601_video"])
def test_yuv_to_rgb_inverts_up_to_rounding(standard: str) -> None:
    """rgb -> yuv -> rgb is within 2 levels (two roundings); greys and black/white exact."""
    x = frames(4, 8, 8)
    back = bi.yuv_to_rgb(bi.rgb_to_yuv(x, standard), standard)
    assert back.shape == x.shape and back.dtype == np.uint8
    assert np.abs(back.astype(int) - x).max() <= 2
    grey = pixels(BLACK, WHITE, GREY)
    assert bi.yuv_to_rgb(bi.rgb_to_yuv(grey, standard), standard).tolist() == grey.tolist()


def test_nv12_shapes_and_round_trip() -> None:
    """y N x H x W, uv N x H/2 x W/2 x 2; chroma-flat frames survive nv12 exactly."""
    yuv = bi.rgb_to_yuv(frames(3, 4, 6))
    y, uv = bi.to_nv12(yuv)
    assert y.shape == (3, 4, 6) and uv.shape == (3, 2, 3, 2)
    assert y.dtype == uv.dtype == np.uint8
    flat = yuv.copy()
    flat[..., 1:] = yuv[:, ::2, ::2, 1:].repeat(2, 1).repeat(2, 2)
    np.testing.assert_array_equal(bi.nv12_to_yuv444(*bi.to_nv12(flat)), flat)
    np.testing.assert_array_equal(bi.nv12_to_yuv444(y, uv)[..., 0], yuv[..., 0])


def test_nv12_picks_top_left_chroma_not_the_average() -> None:
    """Each 2x2 block keeps its [::2, ::2] chroma sample; the other three are ignored."""
    yuv = np.zeros((1, 2, 2, 3), dtype=np.uint8)
    yuv[0, :, :, 1] = [[10, 200], [200, 200]]
    yuv[0, :, :, 2] = [[250, 0], [0, 0]]
    _, uv = bi.to_nv12(yuv)
    assert uv[0, 0, 0].tolist() == [10, 250]


def test_nearest_upsampling_fills_each_block() -> None:
    """nv12_to_yuv444 copies uv[i, j] to rows 2i..2i+1, columns 2j..2j+1."""
    y = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    uv = np.array([[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]], dtype=np.uint8)
    yuv = bi.nv12_to_yuv444(y, uv)
    assert yuv.shape == (1, 4, 4, 3)
    np.testing.assert_array_equal(yuv[..., 0], y)
    assert yuv[0, :, :, 1].tolist() == [[1, 1, 3, 3], [1, 1, 3, 3], [5, 5, 7, 7], [5, 5, 7, 7]]
    assert yuv[0, 3, 0, 2] == 6


def test_center_range() -> None:
    """YUV444_128: 0 -> -128, 128 -> 0, 255 -> 127, int8; float input refused."""
    out = bi.center(np.array([0, 1, 127, 128, 255], dtype=np.uint8))
    assert out.dtype == np.int8 and out.tolist() == [-128, -127, -1, 0, 127]
    with pytest.raises(SimulatorError):
        bi.center(np.array([0.5]))


@pytest.mark.parametrize("h, w", [(3, 4), (4, 5)])
def test_odd_sizes_are_refused(h: int, w: int) -> None:
    """nv12 needs even H and W, both ways."""
    with pytest.raises(SimulatorError, match="even"):
        bi.to_nv12(frames(1, h, w))
    with pytest.raises(SimulatorError, match="even"):
        bi.nv12_to_yuv444(np.zeros((1, h, w), np.uint8), np.zeros((1, h // 2, w // 2, 2), np.uint8))


def test_bad_inputs_are_refused() -> None:
    """Unknown standard, wrong dtype or shape, mismatched planes: SimulatorError."""
    with pytest.raises(SimulatorError, match="colour standard"):
        bi.rgb_to_yuv(frames(), "bt709")
    with pytest.raises(SimulatorError, match="uint8"):
        bi.rgb_to_yuv(frames().astype(np.float32))
    with pytest.raises(SimulatorError, match="uint8"):
        bi.rgb_to_yuv(frames()[..., :2])
    with pytest.raises(SimulatorError, match="does not match"):
        bi.nv12_to_yuv444(np.zeros((1, 4, 4), np.uint8), np.zeros((1, 2, 3, 2), np.uint8))


def test_preprocess_yuv444_training_from_nv12_and_yuv444() -> None:
    """Training yuv444: the centered YUV444 (nv12 upsampled by nearest), dict or tuple."""
    yuv = bi.rgb_to_yuv(frames(2, 4, 4))
    y, uv = bi.to_nv12(yuv)
    attrs = {"runtime_format": "nv12", "training_format": "yuv444"}
    expected = bi.center(bi.nv12_to_yuv444(y, uv))
    np.testing.assert_array_equal(bi.preprocess((y, uv), attrs), expected)
    np.testing.assert_array_equal(bi.preprocess({"y": y, "uv": uv}, attrs), expected)
    out = bi.preprocess(yuv, {"runtime_format": "yuv444", "training_format": "yuv444"})
    assert out.dtype == np.int8 and out.shape == (2, 4, 4, 3)
    np.testing.assert_array_equal(out, bi.center(yuv))


def test_preprocess_rgb_training_converts_yuv_back() -> None:
    """Training rgb from yuv444: yuv_to_rgb - 128, so it loses only the matrix rounding;
    from nv12 it also loses chroma detail; rgb/bgr runtime only reorders and centers."""
    x = frames(2, 4, 4)
    yuv = bi.rgb_to_yuv(x)
    rgb_attrs = {"training_format": "rgb", "color": "bt601_full"}
    out = bi.preprocess(yuv, {**rgb_attrs, "runtime_format": "yuv444"})
    np.testing.assert_array_equal(out, bi.center(bi.yuv_to_rgb(yuv)))
    assert np.abs(out.astype(int) + 128 - x).max() <= 2
    via_nv12 = bi.preprocess(bi.to_nv12(yuv), {**rgb_attrs, "runtime_format": "nv12"})
    np.testing.assert_array_equal(via_nv12[:, ::2, ::2], out[:, ::2, ::2])
    np.testing.assert_array_equal(
        bi.preprocess(x, {**rgb_attrs, "runtime_format": "rgb"}), bi.center(x)
    )
    bgr_in = bi.preprocess(x[..., ::-1], {**rgb_attrs, "runtime_format": "bgr"})
    np.testing.assert_array_equal(bgr_in, bi.center(x))
    bgr_out = bi.preprocess(x, {"runtime_format": "rgb", "training_format": "bgr"})
    np.testing.assert_array_equal(bgr_out, bi.center(np.ascontiguousarray(x[..., ::-1])))


def test_preprocess_gray() -> None:
    """Training gray: the Y plane (from nv12) or the gray frame, centered, one channel."""
    yuv = bi.rgb_to_yuv(frames(1, 4, 4))
    y, uv = bi.to_nv12(yuv)
    out = bi.preprocess((y, uv), {"runtime_format": "nv12", "training_format": "gray"})
    assert out.shape == (1, 4, 4, 1)
    np.testing.assert_array_equal(out[..., 0], bi.center(y))
    same = bi.preprocess(y, {"runtime_format": "gray", "training_format": "gray"})
    np.testing.assert_array_equal(same, out)


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"runtime_format": "jpeg", "training_format": "rgb"}, "unknown runtime_format"),
        ({"runtime_format": "nv12", "training_format": "hsv"}, "unknown training_format"),
        ({"runtime_format": "nv12", "training_format": "rgb", "color": "x"}, "standard"),
        ({"runtime_format": "rgb", "training_format": "yuv444"}, "cannot take rgb"),
        ({"runtime_format": "gray", "training_format": "rgb"}, "cannot take gray"),
        ({"runtime_format": "nv12", "training_format": "featuremap"}, "QUANTIZE"),
    ],
)
def test_preprocess_refuses_unknown_or_unsupported_formats(attrs: dict, match: str) -> None:
    """Unknown formats and unsupported runtime/training pairs are SimulatorErrors."""
    yuv = bi.rgb_to_yuv(frames(1, 4, 4))
    with pytest.raises(SimulatorError, match=match):
        bi.preprocess(bi.to_nv12(yuv), attrs)


def test_preprocess_refuses_a_bare_array_as_nv12() -> None:
    """nv12 input must be the two planes."""
    with pytest.raises(SimulatorError, match="nv12 input"):
        bi.preprocess(frames(1, 4, 4), {"runtime_format": "nv12", "training_format": "rgb"})


def test_fold_mean_std_formula() -> None:
    """weight * x + bias == ((x + 128) - mean) / std / s, per channel, grouped-conv shapes."""
    mean, std, scale = [127.5, 100.0, 10.0], [127.5, 50.0, 2.0], 0.05
    weight, bias = bi.fold_mean_std(mean, std, scale)
    assert weight.shape == (3, 1, 1, 1) and bias.shape == (3,)
    x = np.arange(-128, 128, dtype=np.float64)[:, None]
    got = x * weight[:, 0, 0, 0].astype(np.float64) + bias
    want = ((x + 128) - np.array(mean)) / np.array(std) / scale
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-4)
    w1, b1 = bi.fold_mean_std(127.5, 127.5, 1 / 128)
    assert w1.shape == (1, 1, 1, 1) and b1[0] == pytest.approx(0.5 * 128 / 127.5)


def test_fold_mean_std_refuses_bad_values() -> None:
    """std and scale must be positive."""
    with pytest.raises(SimulatorError):
        bi.fold_mean_std([0.0], [0.0], 1.0)
    with pytest.raises(SimulatorError):
        bi.fold_mean_std(0.0, 1.0, -1.0)


def test_module_does_not_import_torch() -> None:
    """simulator.arith.board_input stays importable without torch or stages/."""
    code = (
        "import sys; import simulator.arith.board_input; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('stages')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("color", ["bt601_full", "bt601_video"])
def test_rounding_pixels_bounds_the_colour_round_trip(color):
    """The bound the localizer allows a camera input is what the round trip really does."""
    frames = np.random.default_rng(3).integers(0, 256, (20, 32, 32, 3), dtype=np.uint8)
    back = bi.yuv_to_rgb(bi.rgb_to_yuv(frames, color), color).astype(int) - frames
    bound = bi.rounding_pixels("yuv444", "rgb", color)
    assert np.abs(back).max() == bound == {"bt601_full": 1, "bt601_video": 2}[color]
    assert bi.rounding_pixels("nv12", "yuv444", color) == bi.rounding_pixels("rgb", "rgb") == 0
