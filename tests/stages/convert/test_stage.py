"""convert: integer graph, requantize arithmetic, level settings, refusals and warnings."""

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from schemas.errors import SpecError, StageError
from stages.capture import capture
from stages.context import convert_settings, policy_from_spec
from stages.convert.graph import Converter, ConvertSettings
from stages.convert.stage import run_integer
from stages.pre_export import load_qat_export
from tests.stages.helpers import run_stages

CHAIN = ("prepare", "calibrate", "pre_export", "export", "convert")


def test_integer_graph_agrees_with_qat_export_to_a_step_or_two(make_ctx):
    ctx = make_ctx()
    arts = run_stages(ctx, *CHAIN)
    q = arts["convert"]
    assert q.float_ops == [] and q.metrics[0].stage == "convert"
    x = ctx.evaluation.x
    _, layers = run_integer(ctx.run.root, q, x)
    _, ref = capture(load_qat_export(arts["pre_export"], ctx), torch.from_numpy(x))
    for lid, (ints, scale) in layers.items():
        assert ints.dtype.kind == "i", lid
        per_channel = scale.reshape([-1] + [1] * (ints.ndim - 2)) if scale.size > 1 else scale
        diff = np.abs(ints * per_channel - ref[lid].numpy())
        if ints.dtype == np.int32:  # an accumulator: its steps are tiny, compare to its range
            assert diff.max() <= 0.02 * np.abs(ref[lid].numpy()).max(), lid
        else:  # level none: 16-bit multipliers, fused conv + add; errors add up along edges
            steps = np.round(diff / per_channel)
            assert steps.max() <= 2 and (steps == 0).mean() >= 0.9, lid
    assert abs(q.metrics[0].value - arts["pre_export"].metrics[0].value) <= 2 / len(x)
    # the table op's result keeps qat.onnx's declared int8: a float island fed by it (an
    # edited qat.onnx) must dequantize int8, which the reference evaluator otherwise left int64
    model = onnx.load(str(ctx.run.path(q.onnx_file)))
    lut = next(n for n in model.graph.node if n.op_type == "Lut")
    declared = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    assert declared[lut.output[0]] == onnx.TensorProto.INT8


def test_a_ratio_beyond_narrow_multipliers_names_the_layer_and_the_fix(make_ctx):
    """An int8 conv feeding int16 layers: the add's ratio of scales (about 279) is beyond
    8-bit multipliers (below 127). The error says so, not that a scale is zero."""
    quant = {"activation_dtype": "int16", "overrides": {"conv": "int8"}}
    ctx = make_ctx(quant=quant, stages={"convert": {"multiplier_bits": 8}})
    with pytest.raises(StageError) as e:
        run_stages(ctx, *CHAIN)
    msg = str(e.value)
    assert "convert, layer add: the add ratio of its scales is 278.9" in msg
    assert "beyond 8-bit multipliers" in msg and "ratios below 127" in msg
    assert "stages.convert.multiplier_bits" in msg and "zero" not in msg


def test_levels_set_fusion_and_multiplier_width(make_ctx):
    none, zero = make_ctx(), make_ctx(quant={"consistency_level": 0})
    assert convert_settings(none.spec) == ConvertSettings(16, "half_even", True)
    assert convert_settings(zero.spec) == ConvertSettings(32, "half_even", False)
    arts = run_stages(zero, *CHAIN)
    text = zero.run.path("debug/quantized_onnx.txt").read_text()
    assert "conv2#acc" not in text and "conv2[output]" in text  # conv2 + add not fused
    assert arts["convert"].settings["multiplier_bits"] == 32


def test_zero_scale_is_refused_naming_the_layer(make_ctx):
    ctx = make_ctx()
    arts = run_stages(ctx, "prepare", "calibrate", "pre_export", "export")
    model = onnx.load(str(ctx.run.path(arts["export"].onnx_file)))
    init = next(i for i in model.graph.initializer if i.name == "conv[output]/scale")
    init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    with pytest.raises(StageError, match=r"layer conv: quantizer scale .* zero"):
        Converter(model, ConvertSettings()).run()
    # a vast output scale: the ratio is below any 62-bit shift; the error still names conv
    init.CopyFrom(
        numpy_helper.from_array(np.full_like(numpy_helper.to_array(init), 1e30), init.name)
    )
    with pytest.raises(StageError, match=r"layer conv: cannot convert node .* too small"):
        Converter(model, ConvertSettings()).run()


def test_int16_weights_are_refused_on_nash(make_ctx):
    with pytest.raises(SpecError, match=r"nash-e has no int16 weights"):
        policy_from_spec(make_ctx(quant={"weight_dtype": "int16"}).spec)


def test_mostly_saturating_layer_gets_an_advisor_warning(make_ctx):
    ctx = make_ctx(quant={"observer": "percentile", "percentile": 5.0})
    arts = run_stages(ctx, *CHAIN)
    assert arts["convert"].warnings and "saturates" in arts["convert"].warnings[0]
    assert "saturates" in ctx.run.path("debug/convert_advisor.txt").read_text()
