"""The two int8 convolution kernels of an AMX host, side by side, on the conv shapes of the
bundled and zoo models: qp_conv (csrc/qconv.c, AVX-512 VNNI, windows read in place) and
qp_conv_amx (csrc/qamxconv.c, AMX-INT8 tiles over gathered windows). The ratio is qp_conv's
time over the tiles' (> 1: the tiles are faster), the anchor being qp_conv on the same
plan, input and thread count; the last column says which kernel the executor picks
(``exec_native.AMX_CONV_MIN``). Median over rounds that alternate the two kernels.

    python bench/conv_paths.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from simulator.kernels import exec_native  # noqa: E402
from simulator.kernels.exec_epilogue import Epilogue  # noqa: E402
from simulator.runtime import native  # noqa: E402

SHAPES = [  # name, (batch, in channels, out channels, kernel, height = width, stride)
    ("digits 16->16 3x3 8x8", (256, 16, 16, 3, 8, 1)),
    ("digits 32->32 3x3 8x8", (256, 32, 32, 3, 8, 1)),
    ("MobileNetV2 stem 3->32 3x3 /2", (1, 3, 32, 3, 224, 2)),
    ("MobileNetV2 32->16 1x1 112", (1, 32, 16, 1, 112, 1)),
    ("MobileNetV2 16->96 1x1 112", (1, 16, 96, 1, 112, 1)),
    ("MobileNetV2 24->144 1x1 56", (1, 24, 144, 1, 56, 1)),
    ("MobileNetV2 144->24 1x1 56", (1, 144, 24, 1, 56, 1)),
    ("MobileNetV2 192->32 1x1 28", (1, 192, 32, 1, 28, 1)),
    ("MobileNetV2 320->1280 1x1 7", (1, 320, 1280, 1, 7, 1)),
    ("digits-like 32->10 1x1 8x8", (256, 32, 10, 1, 8, 1)),
    ("MobileNetV2 960->160 1x1 7", (1, 960, 160, 1, 7, 1)),
    ("ResNet stem 3->64 7x7 /2", (1, 3, 64, 7, 224, 2)),
    ("ResNet 64->64 3x3 56", (1, 64, 64, 3, 56, 1)),
    ("ResNet 128->128 3x3 28", (1, 128, 128, 3, 28, 1)),
    ("ResNet 512->512 3x3 7", (1, 512, 512, 3, 7, 1)),
    ("ResNet 64->128 3x3 /2 56", (1, 64, 128, 3, 56, 2)),
    ("ResNet 256->512 3x3 /2 14", (1, 256, 512, 3, 14, 2)),
    ("ResNet downsample 64->128 1x1 /2 56", (1, 64, 128, 1, 56, 2)),
    ("ResNet-50 256->64 1x1 56", (1, 256, 64, 1, 56, 1)),
    ("ResNet-50 64->256 1x1 56", (1, 64, 256, 1, 56, 1)),
    ("ResNet-50 512->2048 1x1 7", (1, 512, 2048, 1, 7, 1)),
]  # fmt: skip


def case(n: int, c: int, o: int, k: int, hw: int, stride: int):
    """A random int8 conv with an int8 requantized output: (plan, run arguments)."""
    gen = torch.Generator().manual_seed(0)
    wmat = torch.randint(-128, 128, (k * k * c, o), dtype=torch.int8, generator=gen)
    x = torch.randint(-128, 128, (n, hw, hw, c), dtype=torch.int8, generator=gen)
    scale = torch.full((o,), 2.0**-16, dtype=torch.float64)
    epi = Epilogue(None, scale, None, -128, 127, torch.int8, "half_even")
    nc = exec_native.plan(wmat, (k, k), c, torch.int8, epi, None, None, 2**30, 2**30)
    p, oh = k // 2, (hw + 2 * (k // 2) - k) // stride + 1
    out = torch.empty(n, oh, oh, -(-o // 16) * 16, dtype=torch.int8)
    return nc, (([stride, stride], [p] * 4, [1, 1]), x, None, out)


def median_ms(nc, args, amx: str, rounds: int) -> float:
    os.environ["QPARITY_AMX"] = amx
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        exec_native.run(nc, *args)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    rounds = ap.parse_args().rounds
    if not native.amx_supported():
        print(f"no AMX here: LINEAR and CONV run on {native.linear_kernel()}")
        return
    real_min, exec_native.AMX_CONV_MIN = exec_native.AMX_CONV_MIN, (0, 0)  # time every conv
    print(f"# {torch.get_num_threads()} threads; load {Path('/proc/loadavg').read_text().strip()}")
    print("| conv | qp_conv (VNNI) ms | tiles ms | ratio | executor runs |")
    print("|---|---|---|---|---|")
    for name, shape in SHAPES:
        nc, args = case(*shape)
        want = args[3].clone()
        for amx in "01":  # warm-up, and the two kernels' integers agree
            median_ms(nc, args, amx, 3)
            assert amx == "0" or torch.equal(args[3], want), name
            want = args[3].clone()
        pairs = [(median_ms(nc, args, "0", 1), median_ms(nc, args, "1", 1)) for _ in range(rounds)]
        vnni, tiles = (float(np.median(v)) for v in zip(*pairs, strict=True))
        exec_native.AMX_CONV_MIN, os.environ["QPARITY_AMX"] = real_min, "1"
        picks = "tiles" if exec_native.amx_kp(nc, *args[0][:2]) else "qp_conv"
        exec_native.AMX_CONV_MIN = (0, 0)
        print(f"| {name} | {vnni:.3f} | {tiles:.3f} | {vnni / tiles:.2f}x | {picks} |")


if __name__ == "__main__":
    main()
