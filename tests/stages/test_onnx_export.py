"""QDQ ONNX export: op coverage, Q/DQ parity with torch fake quant, canonical ids kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from schemas.errors import StageError
from stages.capture import capture
from stages.fake_quant import QuantState, freeze_model, quantizers, set_model_state
from stages.layers import ID_KEY
from stages.modelio import prepare_qat
from stages.onnx_export import LAYER_KEY, export_onnx, render_graph_text
from stages.onnx_runner import OnnxRunner
from stages.onnx_shape_ops import target_shape
from stages.quantizer import QuantPolicy
from tests.models import data, tiny

X = torch.from_numpy(data()["train"][0])


class ManyOps(nn.Module):
    """One model over most of the op table (float parity)."""

    def __init__(self, resample: bool):
        super().__init__()
        self.resample = resample
        self.conv = nn.Conv2d(3, 8, 3, padding=2, dilation=2)
        self.gconv = nn.Conv2d(8, 8, 3, padding=1, groups=2, stride=2)
        self.dw = nn.Conv2d(8, 8, 3, padding="same", groups=8)
        self.prelu = nn.PReLU(8)
        self.bn = nn.BatchNorm2d(8)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.conv1d = nn.Conv1d(8, 4, 3, padding=1)
        self.grid = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        y = F.leaky_relu(self.conv(x), 0.1)
        y = self.prelu(self.gconv(y))
        y = F.hardswish(self.dw(y)) - 0.25
        y = self.bn(F.relu6(y) + torch.tanh(y))
        a = F.max_pool2d(y, 3, 3, 1, ceil_mode=True)  # 8 -> 3: torch drops a window
        b = F.avg_pool2d(y, 3, 3, 1, ceil_mode=True, count_include_pad=False)
        c = F.avg_pool2d(y, 3, 2, 1, ceil_mode=True)[:, :, 2:, 2:]  # 8 -> 5: one more
        c = c + F.max_pool2d(y, 3, 2, ceil_mode=True)[:, :, 1:, 1:]  # 8 -> 4
        y = torch.cat([a + c, b], 1)
        a, b = y.split(8, dim=1)
        y = a * b[:, :, 1:, :].mean((2,), keepdim=True).exp() / 2
        y = F.interpolate(y, scale_factor=2, mode="nearest")
        if self.resample:  # float only: see test_resampling_rounds_ties_differently
            y = F.interpolate(y, size=(7, 9), mode="bilinear", align_corners=False)
            y = F.interpolate(y, size=(8, 8), mode="bilinear", align_corners=True)
        y = F.pad(y, (1, 0, 0, 1))
        if self.resample:
            g = torch.tanh(self.grid(y)).permute(0, 2, 3, 1)
            y = F.grid_sample(y, g, align_corners=False)
        t = self.ln(y.flatten(2).transpose(1, 2))
        t = F.gelu(self.fc(t))
        att = torch.softmax(t @ t.transpose(1, 2) * 0.3, -1) @ t
        att = att + F.scaled_dot_product_attention(t, t, t)
        t = F.silu(att).clamp(-1, 1)
        z = self.conv1d(t.transpose(1, 2)).unsqueeze(1).squeeze(1)
        p = F.adaptive_avg_pool2d(y, 1).flatten(1)
        q = torch.chunk(z.reshape(z.shape[0], -1, 2), 2, dim=-1)[1]
        return z.mean(-1) + p[:, :4] + q.sum((1, 2), keepdim=False).unsqueeze(1)


def _many(resample: bool) -> nn.Module:
    torch.manual_seed(0)
    m = ManyOps(resample)
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.2, 0.2)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def _calibrated(model: nn.Module, x: torch.Tensor, **policy):
    gm, infos, _ = prepare_qat(model, x[:2], QuantPolicy(**policy))
    set_model_state(gm, QuantState.CALIBRATION)
    with torch.no_grad():
        gm(x)
    freeze_model(gm)
    set_model_state(gm, QuantState.VALIDATION)
    return gm, infos


@pytest.fixture(scope="module")
def tiny_qat():
    return _calibrated(tiny(), X)


XM = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def many_qat():
    """ManyOps without bilinear resize and grid_sample, calibrated, in VALIDATION state."""
    return (*_calibrated(_many(resample=False), XM), XM)


def _compare_layers(gm, result, x: torch.Tensor, tol: float) -> list[str]:
    """Layer-by-layer torch vs ONNX: max abs diff <= ``tol`` x the tensor's range.

    Every torch layer is captured on the ONNX side unless export lists it as unmapped."""
    out, layers = capture(gm, x)
    ids = [
        i for i, v in layers.items() if isinstance(v, torch.Tensor) and not i.startswith("input:")
    ]  # input: not a layer
    assert set(ids) <= set(result.layer_ids) | set(result.unmapped)
    ids = [i for i in ids if i not in result.unmapped]
    onnx_out, onnx_layers = OnnxRunner(result.model).run_capture(x.numpy(), ids)

    def off(a: np.ndarray, ref: torch.Tensor) -> bool:
        return np.abs(a - ref.numpy()).max() > tol * max(float(ref.abs().max()), 1e-6)

    assert not off(onnx_out[0], out)
    bad = [i for i in ids if off(onnx_layers[i], layers[i])]
    assert not bad, f"layers differing: {bad}"
    return ids


def test_float_graph_matches_torch(tiny_qat):
    many, _ = _calibrated(_many(resample=True), XM)
    for gm, x in ((tiny_qat[0], X), (many, XM)):
        set_model_state(gm, QuantState.FLOAT)
        try:
            result = export_onnx(gm, x[:2])
            assert not any(n.op_type.endswith("QuantizeLinear") for n in result.model.graph.node)
            _compare_layers(gm, result, x[:5], tol=1e-5)  # batch 5: dynamic dim
        finally:
            set_model_state(gm, QuantState.VALIDATION)


def test_qat_graph_matches_fake_quant_layer_by_layer(tiny_qat, many_qat):
    for gm, x in ((tiny_qat[0], X), (many_qat[0], many_qat[2])):
        result = export_onnx(gm, x[:2])
        ops = {n.op_type for n in result.model.graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops
        ids = _compare_layers(gm, result, x, tol=1e-5)
        assert len(ids) > 10


def test_per_channel_int16_qdq_flips_only_at_float_ties():
    """int16 steps are 256x finer than int8: torch (oneDNN) and onnxruntime (MLAS) sum a
    conv in different orders, and the ulp that makes moves a value sitting on a rounding
    tie to the other side. Export is exact; the flips are a kernel property."""
    gm, _ = _calibrated(tiny(), X, overrides={"conv2": "int16"})
    model = export_onnx(gm, X[:2]).model
    inits = {t.name: t for t in model.graph.initializer}
    assert inits["conv2[output]/zero_point"].data_type == onnx.TensorProto.INT16
    w_scale = onnx.numpy_helper.to_array(inits["conv[weight]/scale"])
    assert w_scale.shape == (4,)  # per output channel, axis 0
    q = next(n for n in model.graph.node if n.name == "conv[weight]/q")
    assert onnx.helper.get_attribute_value(q.attribute[0]) == 0
    _, layers = capture(gm, X)
    _, got = OnnxRunner(model).run_capture(X.numpy(), ["conv", "conv2"])
    assert np.array_equal(got["conv"], layers["conv"].numpy())  # int8: exact
    step = float(onnx.numpy_helper.to_array(inits["conv2[output]/scale"]))
    flips = np.abs(_int16_steps(got["conv2"], step) - _int16_steps(layers["conv2"].numpy(), step))
    assert flips.max() <= 1 and (flips > 0).mean() < 0.02


def _int16_steps(v: np.ndarray, step: float) -> np.ndarray:
    """The int16 integers ``q`` of dequantized float32 values ``v = fl32(q * step)``
    (zero point 0), each proven to sit on the grid: ``fl32`` moves ``q * step`` by at most
    half an ulp, so ``v / step`` is ``q`` within ``|q| * eps32 / 2`` (32767 * 2**-24 =
    0.002 steps at the top of the range; a bound of 1e-4 steps held only for small q)."""
    q = v.astype(np.float64) / step
    ints = np.round(q)
    assert (np.abs(q - ints) <= np.abs(q) * np.finfo(np.float32).eps).all()
    assert (np.abs(ints) <= 32768).all()
    return ints


def test_bpu_round_uses_the_custom_quantize_and_the_reference_backend():
    gm, _ = _calibrated(tiny(), X, rounding="bpu_round")
    result = export_onnx(gm, X[:2])
    custom = [n for n in result.model.graph.node if n.domain == "qparity"]
    assert custom and all(n.op_type == "QuantizeLinear" for n in custom)
    assert OnnxRunner(result.model).backend == "reference"
    _compare_layers(gm, result, X[:16], tol=1e-5)


def test_fixed_point_ops_export_as_custom_ops(tiny_qat):
    from stages.table_ops import TableSettings, build_op, find_candidates, rewrite

    gm, _ = _calibrated(tiny(), X)
    found, _ = find_candidates(gm, [])
    ops = {c.layer_id: build_op(gm, c, TableSettings())[0] for c in found}
    assert rewrite(gm, ops) == ["sigmoid"]
    result = export_onnx(gm, X[:2])
    lut = next(n for n in result.model.graph.node if n.domain == "qparity")
    assert (lut.op_type, lut.name) == ("Lut", "sigmoid")
    names = [n.name for n in result.model.graph.node]
    assert names[names.index("sigmoid") - 1 : names.index("sigmoid") + 2] == [
        "sigmoid/q",
        "sigmoid",
        "sigmoid/dq",
    ]
    _compare_layers(gm, result, X[:16], tol=1e-5)


def test_every_layer_id_survives_save_and_load(many_qat, tmp_path):
    gm, infos, _ = many_qat
    result = export_onnx(gm, many_qat[2][:2], tmp_path / "m.onnx", [i.layer_id for i in infos])
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(loaded, full_check=True)
    by_meta = {p.value for n in loaded.graph.node for p in n.metadata_props if p.key == LAYER_KEY}
    by_name = {n.name for n in loaded.graph.node}
    torch_ids = {n.meta[ID_KEY] for n in gm.graph.nodes if ID_KEY in n.meta}
    for layer in torch_ids | {i.layer_id for i in infos}:
        assert (layer in by_meta and layer in by_name) or layer in result.unmapped, layer
    assert set(result.layer_ids) <= by_meta & by_name


def test_identity_ops_are_listed_unmapped_and_folded_bn_too():
    class WithIdentity(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x))).contiguous().clone()

    gm, infos = _calibrated(WithIdentity().eval(), X)
    result = export_onnx(gm, X[:2], expected_ids=[i.layer_id for i in infos])
    assert "folded" in result.unmapped["bn"]
    assert any("identity" in reason for reason in result.unmapped.values())
    _compare_layers(gm, result, X, tol=1e-5)


def test_graph_text_numbers_every_node(tiny_qat):
    model = export_onnx(tiny_qat[0], X[:2]).model
    lines = render_graph_text(model).splitlines()
    assert len(lines) == len(model.graph.node)
    assert lines[0].startswith("0 | conv[weight]/q | ai.onnx::QuantizeLinear | conv |")
    conv = next(ln for ln in lines if "| ai.onnx::Conv | conv |" in ln)
    assert "pads=[1, 1, 1, 1]" in conv and "-> conv/raw" in conv


def test_dynamic_reshape_rule_and_unsupported_shapes():
    assert target_shape(("s0", 4, 8), ("s0", 32)) == [0, 32]
    assert target_shape(("s0", 4, 8), (2, "2*s0", 8)) == [2, -1, 8]
    with pytest.raises(ValueError, match="2 dynamic dims"):
        target_shape(("s0", 4), ("s1", "s0*4"))


def test_adaptive_pooling_to_uneven_windows_pools_each_window():
    """8 -> 3 (windows 0-3, 2-6, 5-8) and 8 -> 5: torch's windows, within a step."""

    class Uneven(nn.Module):
        def forward(self, x):
            return F.adaptive_avg_pool2d(x, 3) - F.adaptive_max_pool2d(x, (3, 5))[..., 1:4]

    gm, _ = _calibrated(Uneven(), X)
    got = OnnxRunner(export_onnx(gm, X[:2]).model).run(X.numpy())[0]
    with torch.no_grad():
        want = gm(X).numpy()
    assert got.shape == want.shape == (len(X), 1, 3, 3)
    assert np.abs(got - want).max() < 0.02 and np.mean(got == want) > 0.9


def test_unknown_target_is_named():
    gm, _ = _calibrated(tiny(), X)
    node = next(n for n in gm.graph.nodes if n.meta.get(ID_KEY) == "sigmoid")
    node.target = torch.ops.aten.erf.default
    with pytest.raises(StageError, match=r"node sigmoid \(layer sigmoid\).*aten.erf"):
        export_onnx(gm, X[:2])


def test_unfrozen_quantizer_is_an_error():
    gm, _, _ = prepare_qat(tiny(), X[:2], QuantPolicy())
    set_model_state(gm, QuantState.VALIDATION)
    with pytest.raises(StageError, match=r"conv\[weight\] has no frozen scale"):
        export_onnx(gm, X[:2])


def test_resampling_rounds_ties_differently():
    """Bilinear resize of a quantized tensor lands on exact rounding ties (weights 1/4,
    3/4 of grid values); torch and onnxruntime order the float ops differently, so a tie
    can round either way: the resize layer is the first to differ, by one step at most."""

    class Resample(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)

        def forward(self, x):
            return F.interpolate(self.conv(x), scale_factor=2, mode="bilinear")

    torch.manual_seed(0)
    gm, _ = _calibrated(Resample().eval(), X)
    result = export_onnx(gm, X[:2])
    _, layers = capture(gm, X)
    _, got = OnnxRunner(result.model).run_capture(X.numpy(), ["conv", "resize"])
    assert np.array_equal(got["conv"], layers["conv"].numpy())
    step = next(q.scale.item() for _, q in quantizers(gm) if q.name == "resize[output]")
    flips = np.abs(got["resize"] - layers["resize"].numpy()) / step
    assert flips.max() <= 1.0001 and (flips > 0.5).mean() < 0.05


class ClassToken(nn.Module):
    """A ViT's class token as timm and torchvision write it: expanded to the batch."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(1, 8, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 8))

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        return torch.cat([cls, x], dim=1)[:, 0] * 2


def test_a_class_token_expanded_to_the_batch_keeps_the_batch_dynamic():
    gm, _ = _calibrated(ClassToken(), X)
    result = export_onnx(gm, X[:2])
    ops = [n.op_type for n in result.model.graph.node]
    assert "Shape" in ops and "Expand" in ops  # the batch is read at run time
    for batch in (1, 5):
        ids = _compare_layers(gm, result, X[:batch], tol=1e-5)
        assert "reshape" in ids


def test_every_op_prepare_accepts_has_an_onnx_translation():
    """Else prepare lets the op in and export stops on it (abs and neg did)."""
    from stages.layers import OP_TABLE
    from stages.ops import onnx_rules

    missing = sorted(op for target, (op, _) in OP_TABLE.items() if target not in onnx_rules())
    assert missing == []


class BiasTable(nn.Module):
    """levit's attention bias: ``biases[:, idxs]``, a parameter indexed on dim 1."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.biases = nn.Parameter(torch.randn(2, 5))
        self.register_buffer("idxs", torch.randint(0, 5, (8, 8)), persistent=False)

    def forward(self, x):
        return self.conv(x) + self.biases[:, self.idxs]


def test_a_table_indexed_on_a_later_dim_exports_as_a_gather_on_that_dim():
    gm, _ = _calibrated(BiasTable(), X)
    set_model_state(gm, QuantState.FLOAT)
    result = export_onnx(gm, X[:2])
    gathers = [n for n in result.model.graph.node if n.op_type == "Gather"]
    assert [a.i for n in gathers for a in n.attribute if a.name == "axis"] == [1]
    _compare_layers(gm, result, X[:3], tol=1e-5)
