"""Injected faults record whether they changed anything (a fault can apply and do nothing)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx

from schemas.spec_faults import FaultSpec
from schemas.tables import read_run_table
from stages.context import convert_settings
from stages.convert.graph import Converter
from stages.fault_effects import board_effect, copy_model, table_effect
from stages.faults import coarsen_tables, inject_convert
from tests.stages.helpers import run_stages


def test_convert_faults_say_whether_the_layer_computes_anything_else(make_ctx):
    """conv2 is fused with the add (level none): its output stays int32, so a scale fault
    has empty multipliers to scale and a rounding flip has nothing to round."""
    ctx = make_ctx()
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export", "export")
    src = onnx.load(str(ctx.run.path(arts["export"].onnx_file)))

    def inject(**fault) -> dict:
        c = replace(ctx, spec=ctx.spec.model_copy(update={"faults": [FaultSpec(**fault)]}))
        model, layers = Converter(copy_model(src), convert_settings(c.spec)).run()
        inject_convert(c, model, layers)
        (row,) = read_run_table(c.run, "faults")
        return row

    scaled = inject(kind="scale_steps", layer="conv2", amount=2)
    assert scaled["changed"] is False and "int32 output" in scaled["reason"]
    flipped = inject(kind="rounding_flip", layer="conv2")
    assert flipped["changed"] is False and "no output value of conv2 changes" in flipped["reason"]
    assert "rounding" in flipped["reason"]  # the attribute did flip
    dropped = inject(kind="bias_drop", layer="conv2")
    assert dropped["changed"] is True and "output values of conv2 change" in dropped["reason"]
    assert inject(kind="scale_steps", layer="conv", amount=2)["changed"] is True


def test_coarsening_an_already_coarse_table_changes_nothing():
    coarse = {"t": np.repeat(np.arange(4), 8)[None, :].astype(np.int16)}
    assert not table_effect(coarse, coarsen_tables(coarse, 3)).changed
    fine = {"t": np.arange(32, dtype=np.int16)[None, :]}
    effect = table_effect(fine, coarsen_tables(fine, 3))
    assert effect.changed and effect.reason.startswith("28 of 32 table entries")


def test_camera_faults_change_nothing_where_the_camera_path_is_not_what_they_hit():
    swap, other_range = (
        FaultSpec(kind="preprocess_swap", amount=0),
        FaultSpec(kind="preprocess_swap", amount=1),
    )
    colour = np.zeros((2, 4, 4, 3), np.uint8)
    colour[..., 0] = 200
    grey = np.full((2, 4, 4, 3), 90, np.uint8)
    nv12 = SimpleNamespace(runtime_format="nv12", color="bt601_full")
    assert board_effect(swap, nv12, colour).changed
    assert not board_effect(swap, nv12, grey).changed
    assert board_effect(other_range, nv12, grey).changed
    rgb = SimpleNamespace(runtime_format="rgb", color="bt601_full")
    assert not board_effect(other_range, rgb, colour).changed
    fm = SimpleNamespace(runtime_format="featuremap", color="bt601_full")
    assert "feature maps" in board_effect(swap, fm, colour).reason


def test_a_calib_scale_fault_is_judged_by_the_scale_it_leaves(make_ctx):
    """A factor this close to 1 rounds away in the float32 scale: recorded as applied, but
    changing nothing (it was recorded as a change because the factor was not 1)."""
    faults = [{"kind": "calib_scale", "layer": "conv", "amount": a} for a in (1e-9, -4)]
    ctx = make_ctx(faults=faults)
    run_stages(ctx, "prepare", "calibrate")
    tiny, halved = read_run_table(ctx.run, "faults")
    assert tiny["changed"] is False and "rounds away" in tiny["reason"]
    assert halved["changed"] is True and halved["reason"].startswith("output scale ")
