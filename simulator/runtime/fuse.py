"""Calls of a frozen plan joined into one where the plan shows their buffer between them is
theirs alone.

A frozen plan (:mod:`simulator.runtime.frozen`) knows every call of a run and every buffer
each call touches, so it can see what one instruction at a time cannot: that a buffer is
written by one call, read by the next and touched by no other, and that the two calls
could be one pass without it. One such chain is every image model's first three calls:
QUANTIZE of the float input (``qp_quantize``: x [N, C, H, W] float32 -> int8), LAYOUT
ToNHWC (``qp_to_nhwc``: to 16-byte pixels, channels 3..15 zero) and the stem conv's
``qp_pad`` (to 3-byte pixels again, offset by ``qp_pad_offset()``, zeros around). At
224 x 224 x 3 they write 150 KB, then 800 KB, then 153 KB, and read each back: as
bench/simulator.py times MobileNetV2 at batch 1 (after the other engines ran) the first
two took 0.11 ms of its 1.6 ms. ``qp_quantize_pad`` (csrc/qquant.c) computes each value as
``qp_quantize`` does and writes it straight to where ``qp_pad`` would put it.

:func:`join` only rewrites calls whose arguments say the chain holds: the pointers line up
(each call reads exactly the buffer the one before wrote, from its start), the middle
buffers are used by no other call and are no program output, the sizes agree, and the
quantize's scale is one value or one per channel. The joined call returns what
``qp_quantize`` returns (1 for a value that is not finite: the plan then steps aside as
before). Its time counts as the QUANTIZE instruction's; the LAYOUT instruction then has no
call in the plan, like a view.
"""

from __future__ import annotations

from simulator.runtime import native

Call = tuple  # (instruction, op, fn, args, fills, return value), as frozen.freeze builds them
Uses = list  # per call: (argument, buffer k, byte offset) of each pointer into a held buffer

CHAIN = ("qp_quantize", "qp_to_nhwc", "qp_pad")


def join(plan: list[Call], uses: list[Uses], own: set[int]) -> tuple[list[Call], list[Uses]]:
    """``plan`` and ``uses`` with each quantize -> ToNHWC -> pad chain (module docstring) as
    one ``qp_quantize_pad`` call; ``own``: buffers that program outputs view."""
    lib = native.untraced()
    if lib is None:
        return plan, uses
    counts: dict[int, int] = {}
    for call_uses in uses:
        for _, k, _ in call_uses:
            counts[k] = counts.get(k, 0) + 1
    out_plan, out_uses, n = [], [], 0
    while n < len(plan):
        joined = _chain(plan[n : n + 3], uses[n : n + 3], counts, own, lib)
        if joined is None:
            out_plan.append(plan[n])
            out_uses.append(uses[n])
            n += 1
            continue
        out_plan.append(joined[0])
        out_uses.append(joined[1])
        n += 3
    return out_plan, out_uses


def _chain(calls: list[Call], uses: list[Uses], counts: dict, own: set, lib):
    """The joined call and its uses for three calls of :data:`CHAIN`, or None."""
    if tuple(c[2].__name__ for c in calls) != CHAIN:
        return None
    (i, op, _, q, fills, rc), (_, _, _, t, _, _), (_, _, _, p, _, _) = calls
    x, f64, outer, cq, inner, scale, half_even, lo, hi, _, out_shift = q
    _, wide, n, c, hw, cp, _ = t
    _, pwide, pn, h, w, cx, pc, pt, pb, pl, pr, cs, _ = p
    if f64 or out_shift or wide or pwide or not 1 <= c <= 3 or (pn, cx, pc, cs) != (n, cp, c, c):
        return None
    if h * w != hw or outer * cq * inner != n * c * hw:
        return None
    per_channel = cq != 1
    if per_channel and (cq, outer, inner) != (c, n, hw):
        return None
    quant_out, nhwc_in, nhwc_out, pad_in = (_use(uses[0], 9), _use(uses[1], 0),
                                            _use(uses[1], 6), _use(uses[2], 0))  # fmt: skip
    if None in (quant_out, nhwc_out) or quant_out != nhwc_in or nhwc_out != pad_in:
        return None
    middle = (quant_out[0], nhwc_out[0])
    if quant_out[1] or nhwc_out[1] or any(counts[k] != 2 or k in own for k in middle):
        return None  # a middle buffer read from elsewhere than its start, or used elsewhere
    args = [x, n, c, h, w, scale, int(per_channel), half_even, lo, hi, pt, pb, pl, pr,
            lib.qp_pad_offset(), p[12]]  # fmt: skip
    joined_uses = [u for u in uses[0] if u[0] == 0] + [(15, *u[1:]) for u in uses[2] if u[0] == 12]
    return (i, op, lib.qp_quantize_pad, args, fills, rc), joined_uses


def _use(call_uses: Uses, at: int) -> tuple[int, int] | None:
    """(buffer k, byte offset) of argument ``at`` when it points into a held buffer."""
    return next(((k, delta) for a, k, delta in call_uses if a == at), None)
