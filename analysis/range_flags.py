"""Ranges int8 cannot carry, read from the float model's values on the probe frames.

A quantized int8 layer is flagged when (figures from its float values ``x`` on the probe
frames and its calibrated scale ``s``):

- outlier range: ``max|x| / p99|x| > OUTLIER_RATIO``: a few values (outlier dimensions, as
  in a trained transformer's residual stream) set the scale, and the typical values get
  only ``p99|x| / s`` int8 steps. p99, not p99.9: two outlier dimensions of 384 are 0.5%
  of the values, so p99.9 would land on the outliers themselves. A Gaussian tensor has a
  ratio near 2, a Laplacian one near 3; 8 is far beyond both;
- lost bulk: the median nonzero ``|x|`` is under ``BULK_MIN_STEPS`` int8 steps: the
  typical value rounds to zero, e.g. an attention mask (-10000 where masked) added to
  scores of magnitude 1.

Each flag also says what the layer is: a residual add (an add one of whose inputs comes
from an earlier add through norm and passthrough ops only: the residual stream, whose
origin is named), a mask add (an add of a constant, or of a mask: an input whose values are
all ``<= 0`` and reach ``MASK_VALUE_MAX`` or below, like BERT's ``(1 - attention_mask) *
-10000`` built from the tokenizer's mask; its range swamps the other input's), or its op
type. Softmax, sigmoid and tanh outputs (``FIXED_RANGE_OPS``) are
never flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.layer_graph import Layer

OUTLIER_RATIO = 8.0
"""``max|x| / p99|x|`` past which a few outliers set an int8 scale."""
BULK_MIN_STEPS = 0.5
"""Int8 steps under which the median nonzero ``|x|`` rounds to zero."""
FIXED_RANGE_OPS = frozenset({"softmax", "sigmoid", "tanh"})
"""Ops whose output range is fixed by the op, not by the data (never flagged: their small
values are lost by design, e.g. masked attention probabilities)."""
MASK_VALUE_MAX = -1e3
"""An add input whose values are all ``<= 0`` and reach this is an additive mask."""
STREAM_OPS = frozenset({"layer_norm", "identity", "reshape", "permute", "dropout", "to"})
"""Ops the residual stream passes through between two adds (post-norm blocks: the norm)."""


@dataclass(frozen=True)
class RangeFlag:
    """One layer whose float range int8 cannot carry (module docstring)."""

    layer_id: str
    op_type: str
    kind: str
    """``residual add``, ``mask add`` or the op type."""
    max_abs: float
    p99: float
    median: float
    scale: float
    stream_from: str | None = None
    """A residual add: the earlier add its stream comes from."""

    @property
    def ratio(self) -> float:
        """``max|x| / p99|x|`` (inf when p99 is 0)."""
        return self.max_abs / self.p99 if self.p99 > 0 else float("inf")

    @property
    def outlier(self) -> bool:
        return self.ratio > OUTLIER_RATIO

    @property
    def lost_bulk(self) -> bool:
        return self.median / self.scale < BULK_MIN_STEPS

    def info(self) -> str:
        """The abnormal_info text: what it is and the figures."""
        what = self.kind + (f" (stream from {self.stream_from})" if self.stream_from else "")
        why = []
        if self.outlier:
            why.append(f"max |x| {self.max_abs:.4g} = {self.ratio:.3g} x p99 {self.p99:.4g} "
                       f"(> {OUTLIER_RATIO:g})")  # fmt: skip
        if self.lost_bulk:
            why.append(f"median |x| {self.median:.3g} gets {self.median / self.scale:.3g} int8 "
                       f"steps (< {BULK_MIN_STEPS:g})")  # fmt: skip
        steps = self.p99 / self.scale
        return (f"{what}: {'; '.join(why)}; int8 scale {self.scale:.4g}: the typical values "
                f"(p99) get {steps:.3g} int8 steps")  # fmt: skip


def range_flags(
    values: dict[str, np.ndarray],
    layers: dict[str, Layer],
    scales: dict[str, float],
    dtypes: dict[str, str],
) -> list[RangeFlag]:
    """The flagged int8 layers in topological order (``values``: float values by layer
    id; ``scales``/``dtypes``: the calibrated int8 scale and dtype of each quantized layer)."""
    out = []
    for lid, layer in layers.items():
        skip = layer.op_type in FIXED_RANGE_OPS or dtypes.get(lid) != "int8"
        if skip or not scales.get(lid) or lid not in values:
            continue
        a = np.abs(np.asarray(values[lid], np.float64)).ravel()
        nonzero = a[a > 0]
        if not nonzero.size:
            continue
        kind, origin = _kind(lid, layers, values)
        flag = RangeFlag(lid, layer.op_type, kind, float(a.max()), float(np.percentile(a, 99)),
                         float(np.median(nonzero)), float(scales[lid]), origin)  # fmt: skip
        if flag.outlier or flag.lost_bulk:
            out.append(flag)
    return out


def _kind(lid: str, layers: dict[str, Layer], values: dict) -> tuple[str, str | None]:
    """(kind, the earlier add of a residual add's stream)."""
    layer = layers[lid]
    if layer.op_type != "add":
        return layer.op_type, None
    producers = [p for p in layer.producers if p in layers or p.startswith("input:")]
    if len(producers) < 2 or any(_is_mask(values.get(p)) for p in producers):
        return "mask add", None
    for p in producers:
        origin = stream_origin(p, layers)
        if origin:
            return "residual add", origin
    return "add", None


def _is_mask(value) -> bool:
    """All values ``<= 0``, the most negative at or below ``MASK_VALUE_MAX``."""
    if value is None:
        return False
    a = np.asarray(value, np.float64)
    return a.size > 0 and a.max() <= 0 and a.min() <= MASK_VALUE_MAX


def stream_origin(lid: str, layers: dict[str, Layer]) -> str | None:
    """The add that ``lid`` is, or comes from through :data:`STREAM_OPS` only."""
    seen = set()
    while lid in layers and lid not in seen:
        seen.add(lid)
        layer = layers[lid]
        if layer.op_type == "add":
            return lid
        if layer.op_type not in STREAM_OPS or len(layer.producers) != 1:
            return None
        lid = layer.producers[0]
    return None
