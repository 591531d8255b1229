"""The reference evaluator at real size: a memory-bounded float Conv and a run that frees.

onnx's reference Conv (``onnx/reference/ops/op_conv.py``) builds a dense dilated kernel and
im2cols it with int64 index arrays: deeplabv3's ASPP convs (3x3 at rates 12/24/36 over 960
channels, a 4x4 map at the reduced size) became 25x25..73x73 kernels and took 0.8, 3.0 and
6.6 GB for one frame (tracemalloc per node), 17 GB RSS at a batch of 16. :class:`Conv`
computes the same sum with strided windows instead, skips the kernel taps that only ever
read padding, and im2cols in blocks of whole frames or output rows of at most
:data:`BLOCK_BYTES`. :func:`run_kept` runs a graph keeping only the asked tensors, so a
run's memory is its live tensors, not every intermediate.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference.op_run import OpRun

BLOCK_BYTES = 32 * 2**20
"""At most this many bytes of im2col columns at a time (a multiple of a frame's
output row is taken, at least one row)."""


def conv(x, w, b=None, group=1, strides=None, pads=None, dilations=None) -> np.ndarray:
    """ONNX Conv (explicit pads, any number of spatial axes), computed in ``x``'s dtype.

    FORMULA: ``y[n, o, p] = b[o] + sum_{c, k} x_pad[n, g*Cg + c, p*stride + k*dilation]
    * w[o, c, k]`` with ``g = o // (O / group)``, zero padding. Columns are ordered
    (channel, kernel tap) as onnx's reference orders them, one matmul per group and block.
    """
    nd = x.ndim - 2
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    pads = list(pads or [0] * 2 * nd)
    out = [
        (x.shape[2 + i] + pads[i] + pads[nd + i] - dilations[i] * (w.shape[2 + i] - 1) - 1)
        // strides[i] + 1
        for i in range(nd)
    ]  # fmt: skip
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group or min(out) < 1:
        raise ValueError(f"Conv: x {x.shape}, w {w.shape}, group {group}, output {out}")
    live, begins = _live_taps(w, x.shape[2:], out, strides, pads, dilations)
    if live is None:  # the windows read padding only: the bias
        y = np.zeros((x.shape[0], w.shape[0], *out), np.result_type(x.dtype, w.dtype))
        return _biased(y, b).astype(x.dtype, copy=False)
    w = live
    xp = _pad_or_crop(x, begins, out, w.shape[2:], strides, dilations)
    view = _windows(xp, w.shape[2:], strides, dilations)  # (N, C, *out, *kernel)
    y = _blocked_matmul(view, w, group)
    return _biased(y, b).astype(x.dtype, copy=False)


def _biased(y: np.ndarray, b) -> np.ndarray:
    if b is not None:
        y += np.asarray(b).reshape(1, -1, *[1] * (y.ndim - 2)).astype(y.dtype)
    return y


def _live_taps(w, size, out, strides, pads, dilations):
    """``w`` cut to the kernel taps that read the input (not only padding) for some output,
    and per axis the input position of the first kept tap (negative: in the begin pad);
    ``None`` when on some axis every tap reads padding only."""
    keep, begins = [slice(None), slice(None)], []
    for i, n in enumerate(size):
        span = (out[i] - 1) * strides[i]
        live = [
            k for k in range(w.shape[2 + i])
            if k * dilations[i] - pads[i] <= n - 1 and k * dilations[i] - pads[i] + span >= 0
        ]  # fmt: skip
        if not live:
            return None, None
        keep.append(slice(live[0], live[-1] + 1))
        begins.append(live[0] * dilations[i] - pads[i])
    return w[tuple(keep)], begins


def _pad_or_crop(x, begins, out, kernel, strides, dilations) -> np.ndarray:
    """The input from ``begins`` to the last position the windows read, per axis: zeros
    where that lies outside the input (padding), cropped where it lies inside."""
    cut, widths = [slice(None), slice(None)], [(0, 0), (0, 0)]
    for i, b in enumerate(begins):
        end = b + (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        n = x.shape[2 + i]
        cut.append(slice(max(b, 0), min(end, n)))
        widths.append((max(-b, 0), max(end - n, 0)))
    x = x[tuple(cut)]
    return np.pad(x, widths) if any(sum(p) for p in widths) else x


def _windows(xp, kernel, strides, dilations) -> np.ndarray:
    """Strided view ``(N, C, *out, *kernel)``: ``view[..., o, k] = xp[..., o*s + k*d]``."""
    nd = len(kernel)
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilations, strict=True)]
    view = sliding_window_view(xp, extent, axis=tuple(range(2, 2 + nd)))
    steps = [slice(None, None, s) for s in strides] + [slice(None, None, d) for d in dilations]
    return view[(Ellipsis, *steps)]


def _blocked_matmul(view, w, group) -> np.ndarray:
    """``w`` (O, Cg, *kernel) times the windows, one block of frames or rows at a time."""
    n, c, nd = view.shape[0], view.shape[1], w.ndim - 2
    out, ksize, o = view.shape[2 : 2 + nd], math.prod(w.shape[2:]), w.shape[0]
    dtype = np.result_type(view.dtype, w.dtype)
    wm = w.reshape(group, o // group, -1).astype(dtype, copy=False)
    y = np.empty((n, o, *out), dtype)
    row = c * ksize * math.prod(out[1:]) * dtype.itemsize  # one frame's output row
    rows = max(1, BLOCK_BYTES // row)
    for frames, lines in _blocks(n, out[0], rows):
        part = view[frames, :, lines]  # (n_b, C, h_b, *rest, *kernel)
        part = part.reshape(part.shape[0], group, c // group, *part.shape[2:])
        cols = _columns(part, nd, group)
        yb = np.matmul(wm, cols)  # (G, O/G, n_b * h_b * rest)
        yb = yb.reshape(o, part.shape[0], *part.shape[3 : 3 + nd])
        y[frames, :, lines] = np.moveaxis(yb, 0, 1)
    return y


def _columns(part, nd, group) -> np.ndarray:
    """(n_b, G, Cg, *out_b, *kernel) windows -> (G, Cg * K, n_b * prod(out_b)) columns."""
    axes = (1, 2, *range(3 + nd, 3 + 2 * nd), 0, *range(3, 3 + nd))
    cols = part.transpose(axes)
    return cols.reshape(group, -1, part.shape[0] * math.prod(part.shape[3 : 3 + nd]))


def _blocks(n: int, height: int, rows: int):
    """(frames, lines) slices: whole frames when ``rows`` covers one, else rows of a frame."""
    if rows >= height:
        step = rows // height
        for i in range(0, n, step):
            yield slice(i, i + step), slice(None)
        return
    for i in range(n):
        for h in range(0, height, rows):
            yield slice(i, i + 1), slice(h, h + rows)


def _auto_pads(auto_pad, size, kernel, strides, dilations, pads):
    """Explicit pads for ``auto_pad`` (VALID, SAME_UPPER, SAME_LOWER; else ``pads``)."""
    nd = len(size)
    if auto_pad == "VALID":
        return [0] * 2 * nd
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return pads
    head, tail = [], []
    for i, n in enumerate(size):
        extent = (kernel[i] - 1) * dilations[i] + 1
        need = max(0, (-(-n // strides[i]) - 1) * strides[i] + extent - n)
        first = (need + 1) // 2 if auto_pad == "SAME_LOWER" else need // 2
        head.append(first)
        tail.append(need - first)
    return head + tail


class Conv(OpRun):
    """ONNX Conv for the reference evaluator through :func:`conv` (no dense dilated kernel,
    bounded im2col); float results equal onnx's own up to summation order."""

    op_domain = ""

    def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None,
             kernel_shape=None, pads=None, strides=None):  # fmt: skip
        if X.ndim < 3:
            raise ValueError(f"Conv: X must have at least 3 dimensions, got {X.shape}")
        nd = X.ndim - 2
        strides, dilations = strides or [1] * nd, dilations or [1] * nd
        auto = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        pads = _auto_pads(auto, X.shape[2:], W.shape[2:], strides, dilations, pads)
        return (conv(X, W, B, group or 1, strides, pads, dilations),)


def run_kept(evaluator, feeds: dict[str, np.ndarray], keep: list[str]) -> dict[str, np.ndarray]:
    """Run a ``ReferenceEvaluator``'s graph on ``feeds``; only the tensors ``keep``.

    Each other tensor is dropped after its last consumer, so the memory a run holds is its
    live tensors plus ``keep`` (``evaluator.run(intermediate=False)`` holds them all
    until the end). A graph with If/Loop/Scan (a subgraph may read any outer tensor) runs
    as before, keeping everything."""
    nodes = evaluator.rt_nodes_
    if any(node.need_context() for node in nodes):
        results = evaluator.run(None, feeds, intermediate=True)
        return {name: results[name] for name in keep}
    last = {name: i for i, node in enumerate(nodes) for name in node.input}
    wanted = {"", *keep, *evaluator.rt_inits_}
    results = {"": None, **evaluator.rt_inits_, **feeds}
    for i, node in enumerate(nodes):
        missing = [name for name in node.input if name not in results]
        if missing:
            raise RuntimeError(f"no value for input {missing[0]!r} of node {node.onnx_node.name!r}")
        outputs = node.run(*[results[name] for name in node.input])
        results.update(zip(node.output, outputs, strict=False))
        for name in {*node.input, *node.output}:
            if last.get(name, -1) <= i and name not in wanted:
                results.pop(name, None)
    return {name: results[name] for name in keep}
