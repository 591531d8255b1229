"""Op coverage (docs/design.md "Op coverage"): each op family of tests/stages/op_models.py
through the chain up to board_sim. Every stage completes, compile proves the program
bit-exact against quantized.onnx (compile raises otherwise), convert's integers agree with
the fake-quant (qat.onnx) model, and any float island is listed in model_check_result.txt
and runs on the board's CPU side."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from qparity.views import show_run
from schemas.spec import parse_spec
from schemas.store import RunStore
from simulator.program import hbm
from stages.context import RunContext
from stages.registry import code_version
from stages.stage_models import open_stage_model
from tests.conftest import tiny_spec_dict
from tests.stages.helpers import run_stages
from tests.stages.op_models import FAMILIES

CHAIN = ("prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim")
ISLANDS = {name: [] for name in FAMILIES} | {
    # an unfolded batch norm; group_norm (InstanceNormalization), LogSoftmax
    "norms": ["bn", "gn", "log_softmax"],
    "convs": ["up", "up_grouped"],  # ConvTranspose
    "pools": ["avg_pool"],  # adaptive avg pool with uneven windows (pooled per window)
    "resample": ["resize", "resize_1"],  # bilinear Resize
    "combine": ["div_2"],  # a division by a tensor (no integer Div)
    "math": ["einsum"],  # an Einsum that is no matrix product
    "attention": ["permute", "reshape"],  # the layout ops on the float input
}
"""The float islands each family is expected to leave (listed at convert, run on the CPU)."""


def run_family(tmp_path_factory, name: str):
    data = {"dataset": f"tests.stages.op_models:data_{name}", "calibration_samples": 24,
            "evaluation_samples": 24, "batch_size": 24}  # fmt: skip
    spec = parse_spec(
        tiny_spec_dict(model={"factory": f"tests.stages.op_models:{name}"}, data=data), name
    )
    run = RunStore(tmp_path_factory.mktemp(name)).create_run(
        name, "", "0" * 64, code_version(), {}, {}
    )
    ctx = RunContext(spec=spec, run=run, code_version=code_version())
    return ctx, run_stages(ctx, *CHAIN)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    return request.param, *run_family(tmp_path_factory, request.param)


def _top1(arts, stage):
    return next(m.value for m in arts[stage].metrics if m.metric == "top1")


def test_every_stage_completes_and_compile_is_bit_exact(family):
    name, ctx, arts = family
    assert list(arts) == list(CHAIN)  # run_stages raises at the first stage that fails
    assert "all equal" in ctx.run.path("debug/bit_exact.txt").read_text()
    assert _top1(arts, "board_sim") == _top1(arts, "compile") == _top1(arts, "convert")


def test_convert_agrees_with_the_fake_quant_model(family):
    """The integer model's outputs within a few output steps of qat.onnx's (the same
    quantizers; only requantize rounding and fixed-point tables differ)."""
    name, ctx, _ = family
    idx = np.arange(len(ctx.evaluation))
    fake, _ = open_stage_model(ctx, "export").run(idx)
    ints, _ = open_stage_model(ctx, "convert").run(idx)
    spread = float(np.abs(fake).max())
    assert np.abs(ints - fake).max() <= 0.05 * spread, name


def test_float_islands_are_listed(family):
    """In debug/model_check_result.txt and in the run's summary (qparity show / run)."""
    name, ctx, arts = family
    assert arts["convert"].float_ops == ISLANDS[name]
    report = ctx.run.path("debug/model_check_result.txt").read_text()
    listed = report.split("on the board's CPU side)\n")[1].split()
    assert listed == (ISLANDS[name] or ["none"])
    buf = io.StringIO()
    show_run(Console(file=buf, width=300), ctx.run.root.parent, ctx.run.run_id)
    shown = [ln for ln in buf.getvalue().splitlines() if ln.startswith("float islands")]
    want = ", ".join(ISLANDS[name])
    assert shown == ([f"float islands (run on the board's CPU side): {want}"] if want else [])


@pytest.mark.parametrize("family", ["combine"], indirect=True)
def test_layout_ops_on_constants_are_folded(family):
    """The relative position bias (a parameter gathered by constant indices, permuted,
    unsqueezed) is one constant of the add by compile: no instruction computes it."""
    _, ctx, arts = family
    folded = set(arts["convert"].folded_constants)
    assert {"slice_1", "permute"} <= folded
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    assert not folded & {lid for i in program.instructions for lid in i.layer_ids}
