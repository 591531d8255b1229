"""The LAYOUT instruction: ONNX data-movement ops on whole torch tensors, no arithmetic.

:data:`LAYOUT_OPS` maps an ONNX op type (plus the executor's ToNHWC / ToNCHW) to
``fn(data inputs, const inputs, ONNX attrs, number of outputs) -> [tensors]``;
:func:`k_layout` is the executor kernel that dispatches on ``attrs["op_type"]``, and
:func:`to_reference` turns a stored buffer back into the reference (NCHW) layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from schemas.errors import SimulatorError
from simulator.kernels import exec_native_move
from simulator.kernels.exec_kernels import numel
from simulator.runtime.memo import derived


def _ints(t) -> tuple[int, ...] | None:
    """A constant input as Python ints (``None`` when absent), converted once per tensor."""
    if t is None:
        return None
    return derived(t, "ints", lambda: tuple(int(i) for i in t.reshape(-1).tolist()))


def _arg(cs: list, i: int, attrs: dict, name: str) -> tuple[int, ...] | list[int] | None:
    """Const input ``i`` (opset >= 13 style) or the older attribute ``name``."""
    v = _ints(cs[i]) if len(cs) > i else None
    return v if v is not None else attrs.get(name)


def _reshape(xs, cs, attrs, n):
    """A view when the strides allow it, else one compiled strided copy first."""
    shape, x = _ints(cs[0]), xs[0]
    if not int(attrs.get("allowzero", 0)):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [_view_or_copy(x, shape)]


def _view_or_copy(x: torch.Tensor, shape) -> torch.Tensor:
    try:
        return x.view(shape)
    except RuntimeError:  # not expressible as a view of x's strides
        return exec_native_move.contiguous(x).view(shape)


def _transpose(xs, cs, attrs, n):
    return [xs[0].permute(attrs.get("perm") or list(range(xs[0].ndim))[::-1])]


def _flatten(xs, cs, attrs, n):
    x = xs[0]
    axis = int(attrs.get("axis", 1)) % (x.ndim + 1)
    return [_view_or_copy(x, (numel(x.shape[:axis]), numel(x.shape[axis:])))]


def _squeeze(xs, cs, attrs, n):
    x, axes = xs[0], _arg(cs, 0, attrs, "axes")
    if axes is None:
        return [x.squeeze()]
    return [x.squeeze(tuple(a % x.ndim for a in axes))]


def _unsqueeze(xs, cs, attrs, n):
    x, axes = xs[0], _arg(cs, 0, attrs, "axes")
    for a in sorted(a % (x.ndim + len(axes)) for a in axes):
        x = x.unsqueeze(a)
    return [x]


def _slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice clamping: negatives + dim; step > 0: [0, dim]; step < 0: [0|-1, dim-1]."""
    start, end = (v + dim if v < 0 else v for v in (start, end))
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


def _slice(xs, cs, attrs, n):
    """Positive steps as views (a whole-axis slice costs nothing), negative ones gathered."""
    x, starts, ends = xs[0], _arg(cs, 0, attrs, "starts"), _arg(cs, 1, attrs, "ends")
    axes = _arg(cs, 2, attrs, "axes") or list(range(len(starts)))
    steps = _arg(cs, 3, attrs, "steps") or [1] * len(starts)
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        a %= x.ndim
        start, end = _slice_bounds(x.shape[a], s, e, st)
        if st > 0:
            x = x[(slice(None),) * a + (slice(start, max(start, end), st),)]
        else:
            x = x.index_select(a, torch.arange(start, end, st))
    return [x]


def _gather(xs, cs, attrs, n):
    """Gather(data, indices); ``table``: the data is the constant (an embedding table
    indexed by the token-id buffer)."""
    x, idx = (cs[0], xs[0]) if attrs.get("table") else (xs[0], cs[0] if cs else xs[1])
    idx = idx.long()
    axis = int(attrs.get("axis", 0)) % x.ndim
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    y = x.index_select(axis, idx.reshape(-1))
    return [y.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :])]


def _split(xs, cs, attrs, n):
    x, axis = xs[0], int(attrs.get("axis", 0))
    sizes = _arg(cs, 0, attrs, "split") or -(-x.shape[axis] // n)
    return list(torch.split(x, sizes, dim=axis))


def _concat(xs, cs, attrs, n):
    return [torch.cat([*xs, *(c for c in cs if c is not None)], dim=int(attrs["axis"]))]


_PAD_INDEX = {
    "edge": lambda idx, dim: idx.clamp(0, dim - 1),
    "reflect": lambda idx, dim: dim - 1 - (dim - 1 - idx.abs()).abs(),
    "wrap": lambda idx, dim: idx % dim,
}
"""Source position of each padded position along one axis, per non-constant mode."""


def _pad(xs, cs, attrs, n):
    """ONNX Pad: modes constant (negative pads crop), edge, reflect, wrap (circular)."""
    x, pads = xs[0], _arg(cs, 0, attrs, "pads")
    value = cs[1].item() if len(cs) > 1 and cs[1] is not None and cs[1].numel() else 0
    axes = [a % x.ndim for a in (_ints(cs[2]) if len(cs) > 2 and cs[2] is not None
                                 else range(x.ndim))]  # fmt: skip
    mode, nd = attrs.get("mode", "constant"), len(axes)
    if mode == "constant":
        widths = [0] * (2 * x.ndim)
        for i, a in enumerate(axes):
            j = 2 * (x.ndim - 1 - a)
            widths[j], widths[j + 1] = pads[i], pads[nd + i]
        return [F.pad(x, widths, value=value)]
    if mode not in _PAD_INDEX:
        raise SimulatorError(f"Pad mode {mode!r} is not supported")
    for i, a in enumerate(axes):
        idx, dim = torch.arange(-pads[i], x.shape[a] + pads[nd + i]), x.shape[a]
        x = x.index_select(a, _PAD_INDEX[mode](idx, dim))
    return [x]


def _expand(xs, cs, attrs, n):
    """ONNX Expand; the target shape is a constant, or a buffer computed at run time
    (a class token expanded to the batch: ``Shape(x)[0:1]`` concatenated with sizes)."""
    shape = _ints(cs[0]) if cs and cs[0] is not None else tuple(xs[1].reshape(-1).tolist())
    return [xs[0].expand(torch.broadcast_shapes(xs[0].shape, shape))]


def _to_nhwc(xs, cs, attrs, n):
    """NCHW -> NHWC with the channel axis zero-padded to ``channels_padded`` (a narrow
    int8/int16 input, up to 32 padded channels, in one compiled pass)."""
    y = xs[0].permute(0, 2, 3, 1)
    padded = int(attrs.get("channels_padded") or y.shape[3])
    if padded <= y.shape[3]:
        return [y]
    if (fast := exec_native_move.to_nhwc(xs[0], padded)) is not None:
        return [fast]
    out = torch.zeros((*y.shape[:3], padded), dtype=y.dtype)  # one memset, one copy
    out[..., : y.shape[3]] = y
    return [out]


def _to_nchw(xs, cs, attrs, n):
    """NHWC (padded) -> NCHW with the first ``channels`` channels."""
    return [xs[0][..., : int(attrs.get("channels") or xs[0].shape[3])].permute(0, 3, 1, 2)]


LAYOUT_OPS = {
    "Reshape": _reshape, "Transpose": _transpose, "Flatten": _flatten, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Slice": _slice, "Gather": _gather, "Split": _split,
    "Concat": _concat, "Pad": _pad, "Identity": lambda xs, cs, attrs, n: [xs[0]],
    "Expand": _expand, "ToNHWC": _to_nhwc, "ToNCHW": _to_nchw,
}  # fmt: skip
"""ONNX op type (plus ToNHWC / ToNCHW) -> data-movement function."""


def k_layout(instr, bufs, consts):
    """LAYOUT: the ONNX data-movement op ``attrs["op_type"]`` (:data:`LAYOUT_OPS`)."""
    op_type = instr.attrs.get("op_type")
    if op_type not in LAYOUT_OPS:
        raise SimulatorError(f"unknown layout op {op_type!r}", hint=f"one of {sorted(LAYOUT_OPS)}")
    xs = [bufs[n] for n in instr.inputs]
    cs = [consts[c] if c else None for c in instr.consts]
    return LAYOUT_OPS[op_type](xs, cs, instr.attrs, len(instr.outputs))


def to_reference(t: torch.Tensor, layout) -> torch.Tensor:
    """A buffer in the reference layout: nhwc -> NCHW with ``channels`` kept; else as is."""
    if layout is None or layout.kind != "nhwc" or t.ndim != 4:
        return t
    return _to_nchw([t], [], {"channels": layout.channels}, 1)[0]
