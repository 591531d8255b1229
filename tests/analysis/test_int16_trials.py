"""int16 trials: an override re-run on calibrate's fake-quant model, ranked by what it restores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from analysis.int16_trials import (
    TrialModel,
    in_int16,
    leave_one_out,
    output_quantizers,
    run_trials,
)
from stages.fake_quant import QuantState, freeze_model, set_model_state
from stages.modelio import prepare_qat
from stages.outputs import first_output
from stages.quantizer import QuantPolicy


class Outliers(nn.Module):
    """fc1 -> norm (two hidden dimensions 60x: outliers) -> fc2 (the output)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.norm, self.fc2 = nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 8)
        with torch.no_grad():
            self.norm.weight[:2] *= 60.0
            self.fc2.weight[:, :2] = 0.0  # the output reads the ordinary dimensions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.fc1(x)))


@pytest.fixture(scope="module")
def tm() -> TrialModel:
    """The calibrated model (every trial restores it, so the tests share it)."""
    net = Outliers().eval()
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    gm, _, _ = prepare_qat(net, x[:2], QuantPolicy())
    set_model_state(gm, QuantState.CALIBRATION)
    gm(x)
    freeze_model(gm)
    set_model_state(gm, QuantState.VALIDATION)
    with torch.no_grad():
        ref = net(x[:8]).numpy()
    return TrialModel(gm, output_quantizers(gm), QuantPolicy(), (x[:8],), ref, "cosine")


def test_int16_on_the_outlier_layer_restores_the_most_and_is_undone_after(tm):
    before = tm.measure()
    trials = run_trials(tm, ["fc1", "norm", "no.such.layer"], {"both": ["fc1", "norm"]})
    assert [t.target for t in trials][:2] in (["both", "norm"], ["norm", "both"])
    norm = next(t for t in trials if t.target == "norm")
    assert norm.before == before and norm.gain > 0.05 and norm.after > 0.99
    assert "no.such.layer" not in {t.target for t in trials}  # changes no quantizer
    assert tm.measure() == before  # every trial restored the int8 quantizers
    (fq,) = tm.by_layer["norm"]
    assert fq.qdtype == "int8" and fq.quant_max == 127


def test_int16_scale_is_the_calibrated_range_on_the_int16_grid(tm):
    (fq,) = tm.by_layer["norm"]
    int8 = float(fq.scale)
    with in_int16([fq]):
        assert fq.qdtype == "int16" and fq.quant_max == 32767
        assert np.isclose(float(fq.scale), int8 * 255 / 65535, rtol=1e-6)
    assert float(fq.scale) == int8


def test_leave_one_out_shows_what_the_group_needs(tm):
    loo = leave_one_out(tm, ["fc1", "norm"], budget=4)
    assert loo["fc1"].keys == ("norm",) and loo["norm"].keys == ("fc1",)
    assert loo["fc1"].gain > loo["norm"].gain  # without norm the group restores little
    out = first_output(tm.gm(*tm.x))
    assert out.shape == (8, 8)
