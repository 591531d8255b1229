"""QFakeQuantize: states, STE, per-channel, POT, rounding, state_dict, and PT2E end to end."""

from __future__ import annotations

import os

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchao.quantization.pt2e import fake_quantize as tao_fq  # noqa: E402

from schemas.errors import StageError  # noqa: E402
from simulator.arith import fixedpoint  # noqa: E402
from stages.fake_quant import (  # noqa: E402
    QFakeQuantize,
    QuantState,
    freeze_model,
    quantizers,
    set_model_state,
)

PER_CHANNEL = {"qscheme": torch.per_channel_symmetric, "ch_axis": 0}


def calibrated(x: torch.Tensor, **kwargs) -> QFakeQuantize:
    q = QFakeQuantize(**kwargs)
    q(x)
    q.freeze()
    q.set_state(QuantState.VALIDATION)
    return q


def test_states_and_torchao_flags():
    q = QFakeQuantize()
    x = torch.randn(64)
    assert q.state == QuantState.CALIBRATION
    assert q(x) is x and q.observer.has_data
    q.freeze()
    q.set_state("validation")
    assert (q.observer_enabled.item(), q.fake_quant_enabled.item()) == (0, 1)
    before = q.observer.max_val.clone()
    y = q(x * 100)  # not observed: the frozen scale saturates it
    assert torch.equal(q.observer.max_val, before)
    assert y.abs().max() <= 128 * q.scale
    q.set_state(QuantState.FLOAT)
    assert q(x) is x and (q.observer_enabled.item(), q.fake_quant_enabled.item()) == (0, 0)
    tao_fq.enable_observer(q)  # torchao's helpers move our state
    tao_fq.enable_fake_quant(q)
    assert q.state == QuantState.QAT
    tao_fq.disable_observer(q)
    assert q.state == QuantState.VALIDATION


def test_validation_fake_quant_matches_fixedpoint():
    x = torch.randn(2, 3, 8, 8)
    q = calibrated(x, rounding="bpu_round")
    scale = fixedpoint.symmetric_scale(x.abs().max().reshape(1), "int8")
    assert torch.equal(q.scale, scale)
    assert torch.equal(q(x), fixedpoint.fake_quantize(x, scale, "int8", "bpu_round"))
    qp = q.calculate_qparams()
    assert torch.equal(qp[0], q.scale) and qp[1].tolist() == [0]


def test_errors_name_the_quantizer():
    q = QFakeQuantize()
    q.name = "layer1.conv[output]"
    with pytest.raises(StageError, match=r"layer1\.conv\[output\] saw no calibration data"):
        q.freeze()
    q.set_state(QuantState.VALIDATION)
    with pytest.raises(StageError, match="no frozen scale"):
        q(torch.ones(3))
    q.set_state(QuantState.CALIBRATION)
    with pytest.raises(StageError, match="NaN/Inf"):
        q(torch.tensor([float("nan")]))
    with pytest.raises(StageError, match="full int8 range"):
        QFakeQuantize(quant_min=-127, quant_max=127)
    with pytest.raises(StageError, match="qscheme"):
        QFakeQuantize(qscheme=torch.per_tensor_affine)
    with pytest.raises(StageError, match="rounding"):
        QFakeQuantize(rounding="half_up")
    with pytest.raises(StageError, match="state"):
        q.set_state("training")


def test_a_mask_of_finfo_min_is_refused_at_freeze_naming_quantizer_and_value():
    """``(1 - mask) * finfo.min``, the usual attention mask, observed in float32."""
    q = QFakeQuantize()
    q.name = "encoder.layer.0.attention.add[output]"
    q.set_state(QuantState.CALIBRATION)
    mask = torch.tensor([1.0, 1.0, 0.0])
    q((1 - mask) * torch.finfo(torch.float32).min)
    with pytest.raises(StageError, match=r"attention\.add\[output\].*3\.403e\+38") as e:
        q.freeze()
    assert "-1e4" in e.value.hint


def test_straight_through_gradient():
    q = QFakeQuantize(observer="moving_average_minmax", averaging_constant=0.01)
    q(torch.tensor([-1.0, 1.0]))
    q.set_state(QuantState.QAT)
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.7, 1.0, 2.0], requires_grad=True)
    y = q(x)
    y.sum().backward()
    s = q.scale.item()  # recomputed in QAT: EMA amax = 1 + 0.01 * (3 - 1)
    assert s == pytest.approx(2 * 1.02 / 255)
    want = fixedpoint.fake_quantize(x.detach(), q.scale, "int8", "half_even")
    assert torch.equal(y.detach(), want)
    assert x.grad.tolist() == [0, 1, 1, 1, 1, 1, 0]  # -3 and 2 are clamped


def test_qat_with_mse_starts_from_calibrated_scale():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    q = calibrated(x, observer="mse", averaging_constant=0.01)
    cal = q.scale.clone()
    q.set_state(QuantState.QAT)
    q(x)
    hi = fixedpoint.symmetric_scale(x.abs().max().reshape(1), "int8")
    assert cal < q.scale < cal + 0.02 * (hi - cal)  # EMA moved 1% of the way to minmax
    assert q.qat_observer.has_data


def test_per_channel_weight_matches_fixedpoint():
    w = torch.randn(6, 3, 3, 3) * torch.arange(1, 7).reshape(6, 1, 1, 1)
    q = calibrated(w, **PER_CHANNEL)
    amax = w.abs().amax(dim=(1, 2, 3))
    assert q.scale.shape == (6,) and q.zero_point.shape == (6,)
    torch.testing.assert_close(q.scale, fixedpoint.symmetric_scale(amax, "int8"), rtol=0, atol=0)
    want = fixedpoint.fake_quantize(w, q.scale, "int8", "half_even", ch_axis=0)
    assert torch.equal(q(w), want)


def test_pot_scales_are_powers_of_two():
    w = torch.randn(8, 4) * torch.rand(8, 1) * 10
    q = calibrated(w, pot=True, **PER_CHANNEL)
    mant, _ = torch.frexp(q.scale)
    assert torch.all(mant == 0.5)
    assert torch.all(q.scale >= fixedpoint.symmetric_scale(w.abs().amax(dim=1), "int8"))


def test_rounding_modes_differ_exactly_on_ties():
    s = 2.0**-3
    calib = torch.tensor([127.5 * s, -127.5 * s])  # symmetric_scale -> exactly s
    k = torch.arange(-20, 20, dtype=torch.float32)
    ties = (k + 0.5) * s
    even = calibrated(calib, rounding="half_even")
    away = calibrated(calib, rounding="bpu_round")
    assert even.scale.item() == away.scale.item() == s
    diff = (away(ties) - even(ties)) / s
    toward_zero_is_even = torch.trunc(k + 0.5) % 2 == 0
    assert torch.equal(diff != 0, toward_zero_is_even)  # there the modes are one step apart
    assert torch.equal(diff[diff != 0], torch.sign(ties[diff != 0]))
    assert torch.equal(even(ties + 0.1 * s), away(ties + 0.1 * s))  # non-ties agree


def test_state_dict_round_trip_per_channel():
    w = torch.randn(5, 7)
    q = calibrated(w, rounding="bpu_round", pot=True, **PER_CHANNEL)
    fresh = QFakeQuantize(rounding="bpu_round", pot=True, **PER_CHANNEL)
    assert fresh.scale.shape == (1,)
    fresh.load_state_dict(q.state_dict())
    assert fresh.state == QuantState.VALIDATION and fresh.scale.shape == (5,)
    assert torch.equal(fresh(w), q(w))
    assert torch.equal(fresh.observer.amax(), q.observer.amax())


def test_model_helpers_and_repr():
    model = nn.Sequential(nn.Linear(4, 4), QFakeQuantize(), nn.ReLU(), QFakeQuantize())
    named = quantizers(model)
    assert [n for n, _ in named] == ["1", "3"] and model[1].name == "1"
    model[3].name = "head[output]"
    assert quantizers(model)[1][0] == "3" and model[3].name == "head[output]"  # kept
    assert set_model_state(model, QuantState.CALIBRATION) == 2
    model(torch.randn(8, 4))
    assert freeze_model(model) == 2
    set_model_state(model, "validation")
    text = repr(model)
    for part in ("state=VALIDATION", "dtype=int8", "torch.per_tensor_symmetric", "scale=["):
        assert part in text


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _annotate_all(gm: torch.fx.GraphModule) -> None:
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec

    def spec(**kw) -> QuantizationSpec:
        ctr = QFakeQuantize.with_args(observer="minmax", rounding="half_even", pot=False, **kw)
        scheme = torch.per_channel_symmetric if kw["ch_axis"] is not None else None
        return QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=scheme or torch.per_tensor_symmetric,
            ch_axis=kw["ch_axis"],
            observer_or_fake_quant_ctr=ctr,
        )

    act, weight = spec(ch_axis=None), spec(ch_axis=0)
    for node in gm.graph.nodes:
        if node.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default):
            x, w = node.args[0], node.args[1]
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={x: act, w: weight}, output_qspec=act, _annotated=True
            )


def test_pt2e_prepare_calibrate_validate():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import Quantizer

    class AllConvLinear(Quantizer):
        def annotate(self, model):
            _annotate_all(model)
            return model

        def validate(self, model):
            pass

    torch.manual_seed(0)
    model, x = TinyNet().eval(), torch.randn(4, 3, 8, 8)
    dims = ({0: torch.export.Dim("batch")},)
    exported = torch.export.export(model, (x,), dynamic_shapes=dims).module()
    prepared = prepare_pt2e(exported, AllConvLinear())
    found = quantizers(prepared)
    assert len(found) == 6  # conv in/w/out, linear in/w/out
    set_model_state(prepared, QuantState.CALIBRATION)
    for _ in range(3):
        prepared(torch.randn(8, 3, 8, 8))
    freeze_model(prepared)
    set_model_state(prepared, QuantState.VALIDATION)
    for _, q in found:
        assert torch.isfinite(q.scale).all() and (q.scale > 0).all()
    assert sorted(q.scale.numel() for _, q in found) == [1, 1, 1, 1, 8, 10]
    with torch.no_grad():
        ref, got = model(x), prepared(x)
    err = (got - ref).abs().max().item()
    assert 0 < err < 0.1 * ref.abs().max().item()
    step = max(q.scale.max().item() for _, q in found)
    converted = convert_pt2e(prepared)  # torchao reads calculate_qparams: q/dq ops agree
    with torch.no_grad():
        assert (converted(x) - got).abs().max().item() <= step
