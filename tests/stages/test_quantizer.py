"""Where fake quant goes, which dtype, and the power-of-two rules of the consistency levels."""

import math

import pytest
import torch

from schemas.errors import SpecError
from stages.fake_quant import QuantState, freeze_model, quantizers, set_model_state
from stages.modelio import prepare_qat
from stages.quantizer import QuantPolicy
from tests.models import tiny

X = torch.from_numpy(__import__("tests.models", fromlist=["data"]).data()["train"][0])


def _calibrated(policy: QuantPolicy):
    gm, infos, roles = prepare_qat(tiny(), X[:2], policy)
    set_model_state(gm, QuantState.CALIBRATION)
    with torch.no_grad():
        gm(X)
    freeze_model(gm)
    set_model_state(gm, QuantState.VALIDATION)
    return gm, roles


def _is_pot(t: torch.Tensor) -> bool:
    return all(math.log2(v) == round(math.log2(v)) for v in t.flatten().tolist())


@pytest.mark.parametrize(
    ("level", "pot_act", "pot_w"), [(0, False, False), (1, True, False), (2, True, True)]
)
def test_consistency_levels_make_scales_powers_of_two(level, pot_act, pot_w):
    from stages.context import CONSISTENCY_LEVELS

    lv = CONSISTENCY_LEVELS[level]
    gm, roles = _calibrated(
        QuantPolicy(pot_activations=lv["pot_activations"], pot_weights=lv["pot_weights"])
    )
    acts = [fq.scale for n, fq in quantizers(gm) if roles[n][1] != "weight"]
    weights = [fq.scale for n, fq in quantizers(gm) if roles[n][1] == "weight"]
    assert acts and weights
    assert all(_is_pot(s) for s in acts) == pot_act
    assert all(_is_pot(s) for s in weights) == pot_w
    if not pot_act:  # statistic scales: the minmax formula exactly, not a power of two
        assert not any(_is_pot(s) for s in acts)


def test_placement_weights_per_channel_passthrough_unquantized_output_high_precision():
    gm, roles = _calibrated(QuantPolicy())
    placed = {(layer, role) for layer, role in roles.values()}
    assert ("conv", "weight") in placed and ("head", "weight") in placed
    assert ("input:x", "input") in placed
    assert ("relu", "output") not in placed and ("pool", "output") not in placed
    assert ("head", "output") not in placed  # model output stays int32 (high precision)
    conv_w = next(fq for n, fq in quantizers(gm) if roles[n] == ("conv", "weight"))
    assert conv_w.scale.shape == (4,) and conv_w.ch_axis == 0


def test_low_precision_output_when_asked():
    _, roles = _calibrated(QuantPolicy(high_precision_output=False))
    assert ("head", "output") in set(roles.values())


def test_overrides_pick_int16_by_module_path():
    gm, roles = _calibrated(QuantPolicy(overrides={"conv2": "int16"}))
    dtypes = {roles[n]: fq.dtype for n, fq in quantizers(gm)}
    assert dtypes[("conv2", "output")] == torch.int16
    assert dtypes[("conv", "output")] == torch.int8
    assert dtypes[("conv2", "weight")] == torch.int8  # weights are int8 on the BPU


def test_override_matching_no_layer_is_a_spec_error():
    with pytest.raises(SpecError, match=r"quant.overrides.*'hed'.*top-level paths"):
        prepare_qat(tiny(), X[:2], QuantPolicy(overrides={"hed": "int16"}))


def test_rounding_mode_reaches_every_quantizer_and_decides_ties():
    outs = {}
    for mode in ("half_even", "bpu_round"):
        gm, roles = _calibrated(QuantPolicy(rounding=mode, pot_activations=True))
        assert all(fq.rounding == mode for _, fq in quantizers(gm))
        name = next(n for n, r in roles.items() if r == ("input:x", "input"))
        fq = gm.get_submodule(name)
        ties = (torch.arange(-5, 5) + 0.5) * fq.scale  # exact: the scale is a power of two
        outs[mode] = fq(ties) / fq.scale
    assert outs["half_even"].tolist() == [-4, -4, -2, -2, 0, 0, 2, 2, 4, 4]
    assert outs["bpu_round"].tolist() == [-5, -4, -3, -2, -1, 1, 2, 3, 4, 5]
