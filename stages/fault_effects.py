"""Whether an injected fault changed anything: what it edits, and what that computes.

A fault can be applied and still change nothing: a scale or shift fault on a layer whose
output stays int32 (fused into the next add, its multipliers and shifts are empty), a
rounding flip where no value sits on a tie, a table already constant over the blocks the
coarsening keeps, a red/blue swap of grey camera frames, a camera fault on a board fed
feature maps. Every applied fault is recorded (tables/faults) with ``changed`` and the
reason, judged here:

- convert: the layer's initializers and node attributes before and after; when they
  differ, the outputs of the layer's edited nodes on a calibration batch, run on both
  graphs (a flipped attribute may compute the same integers);
- calibrate: the layer's frozen output scale before and after (a factor this close to 1
  rounds away in float32);
- pre_export: the layer's table entries before and after;
- board_sim: whether the camera path the fault corrupts is used, and alters the frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from schemas.spec_faults import FaultSpec
from stages.onnx_runner import OnnxRunner


@dataclass(frozen=True)
class Effect:
    """What one applied fault did."""

    changed: bool
    reason: str


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy (the faults edit a model in place)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def layer_edits(before: onnx.ModelProto, after: onnx.ModelProto, lid: str) -> list[str]:
    """Names of layer ``lid``'s initializers and ``node.attribute`` entries that differ."""
    prefix = f"{lid}/"
    old = {i.name: numpy_helper.to_array(i) for i in before.graph.initializer}
    edits = [
        i.name
        for i in after.graph.initializer
        if i.name.startswith(prefix) and not np.array_equal(old[i.name], numpy_helper.to_array(i))
    ]
    for a, b in zip(before.graph.node, after.graph.node, strict=True):
        if any(n.startswith(prefix) for n in b.input):
            edits += [
                f"{b.name or b.output[0]}.{y.name}"
                for x, y in zip(a.attribute, b.attribute, strict=True)
                if x != y
            ]
    return edits


def integer_effect(
    before: onnx.ModelProto, after: onnx.ModelProto, lid: str, x: np.ndarray
) -> Effect:
    """A convert fault's effect on layer ``lid`` (module docstring), ``x`` a calibration
    batch."""
    edits = layer_edits(before, after, lid)
    if not edits:
        return Effect(
            False,
            f"no integer or attribute of layer {lid} changes "
            "(e.g. an int32 output: its multipliers and shifts are empty)",
        )
    names = [o for n in after.graph.node if any(i.startswith(f"{lid}/") for i in n.input)
             for o in n.output]  # fmt: skip
    _, old = OnnxRunner(before).run_capture(x, names)
    _, new = OnnxRunner(after).run_capture(x, names)
    differ = sum(int(np.count_nonzero(np.asarray(old[n]) != np.asarray(new[n]))) for n in names)
    total = sum(np.asarray(old[n]).size for n in names)
    where = f"on {len(x)} calibration samples ({', '.join(edits)[:200]} edited)"
    if differ == 0:
        return Effect(False, f"no output value of {lid} changes {where}; e.g. no ties to round")
    return Effect(True, f"{differ} of {total} output values of {lid} change {where}")


def scale_effect(before: np.ndarray, after: np.ndarray) -> Effect:
    """A calibrate fault's effect: whether the layer's frozen output scale changed."""
    old, new = np.asarray(before, np.float64), np.asarray(after, np.float64)
    if np.array_equal(old, new):
        return Effect(False, f"the output scale stays {old.max():.6g} (the factor rounds away)")
    return Effect(True, f"output scale {old.max():.6g} -> {new.max():.6g}")


def table_effect(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> Effect:
    """A pre_export fault's effect: how many table entries it changed."""
    differ = sum(int(np.count_nonzero(before[k] != after[k])) for k in before)
    total = sum(v.size for v in before.values())
    if differ == 0:
        return Effect(False, f"none of the {total} table entries changes (already coarse)")
    return Effect(True, f"{differ} of {total} table entries change")


def board_effect(fault: FaultSpec, cfg, camera: np.ndarray | None) -> Effect:
    """A board_sim fault's effect, from ``stages.board_sim`` (``cfg``) and the camera
    frames (uint8 N x H x W x 3, None without any)."""
    if cfg.runtime_format == "featuremap":
        return Effect(False, "the board is fed feature maps: the camera path is not used")
    if camera is None:
        return Effect(False, "the dataset has no camera frames")
    if fault.amount == 0:
        if np.array_equal(camera[..., 0], camera[..., 2]):
            return Effect(False, "the camera frames have red == blue: the swap changes nothing")
        return Effect(True, "the camera delivers BGR for RGB")
    if cfg.runtime_format not in ("nv12", "yuv444", "gray"):
        return Effect(False, f"runtime_format {cfg.runtime_format} uses no BT.601 conversion")
    return Effect(True, f"the camera converts with the other BT.601 range than {cfg.color}")
