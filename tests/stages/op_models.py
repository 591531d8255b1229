"""Op-coverage models for tests/stages/test_op_coverage.py: one small module per op
family, written the way torch users write them (F.* calls, nn.* modules, in-place
variants), each on 4x8x8 inputs with a linear head of 5 classes (named in specs as
``tests.stages.op_models:<family>``; the data as ``tests.stages.op_models:data_<family>``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Head(nn.Module):
    """conv stem -> body -> flatten -> linear: quantized input, one float-ish output."""

    def __init__(self, features: int):
        super().__init__()
        self.stem = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(features, 5)

    def forward(self, x):
        return self.fc(self.body(self.stem(x)).flatten(1))


class Gates(Head):
    """Piecewise-linear activations as MobileNet/ResNet-style code writes them."""

    def __init__(self):
        super().__init__(8 * 8 * 8)
        self.hswish = nn.Hardswish(inplace=True)
        self.relu6 = nn.ReLU6(inplace=True)
        self.leaky = nn.LeakyReLU(0.1, inplace=True)
        self.prelu = nn.PReLU(8, init=0.2)  # per-channel weights
        with torch.no_grad():
            self.prelu.weight.copy_(torch.tensor([-0.3, -0.2, 0.0, 0.05, 0.1, 0.2, 0.3, 0.4]))

    def body(self, y):
        a = self.hswish(y.clone()) * F.hardsigmoid(y)
        b = F.hardtanh(self.relu6(y.clone() * 2.0), -0.5, 0.5)
        c = self.prelu(y) + self.leaky(y.clone())
        c += a  # in place, as residual code writes it
        c.mul_(0.5).add_(b)
        return F.relu(c, inplace=True)


class Smooth(Head):
    """Smooth activations: sigmoid, tanh, silu, gelu (erf and tanh)."""

    def __init__(self):
        super().__init__(8 * 8 * 8)
        self.act = nn.SiLU(inplace=True)

    def body(self, y):
        a = torch.sigmoid(y) * torch.tanh(y)
        b = F.gelu(y) + F.gelu(y, approximate="tanh")
        return a + b + self.act(y.clone())


class Norms(Head):
    """layer_norm (tokens and channels-last), group_norm, an unfolded batch_norm,
    softmax / log_softmax over several dims."""

    def __init__(self):
        super().__init__(8 * 8 * 8)
        self.gn = nn.GroupNorm(2, 8)
        self.bn = nn.BatchNorm2d(8)  # after an add: nothing to fold it into
        self.ln = nn.LayerNorm(8)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.2, 0.2)
            self.bn.running_var.uniform_(0.5, 2.0)

    def body(self, y):
        y = self.gn(y)
        y = self.bn(y + 1.0)
        t = self.ln(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        s = torch.softmax(y, dim=1) + F.softmax(y, dim=-1) + F.log_softmax(y, dim=2)
        return t + s


class Convs(nn.Module):
    """conv and conv_transpose: grouped, depthwise, dilated, strided, padded any way."""

    def __init__(self):
        super().__init__()
        self.grouped = nn.Conv2d(4, 8, 3, padding=1, groups=2)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.strided = nn.Conv2d(8, 8, 3, stride=2, padding=(1, 0))
        self.reflect = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")
        self.same = nn.Conv2d(8, 8, (1, 3), padding="same", padding_mode="circular")
        self.edge = nn.Conv1d(8, 8, 3, padding=1, padding_mode="replicate")
        self.up = nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1)
        self.up_grouped = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1,
                                             groups=4)  # fmt: skip
        self.fc = nn.Linear(8 * 8 * 8, 5)

    def forward(self, x):
        y = torch.relu(self.depthwise(self.grouped(x)))
        y = self.same(self.reflect(self.strided(y)))  # 8 x 4 x 3
        y = self.edge(y.flatten(2)).view_as(y)  # conv1d over the 12 positions
        y = self.up(F.pad(y, (0, 1)))  # 8 x 8 x 8
        y = y + self.up_grouped(y[:, :, ::2, ::2])
        return self.fc(y.flatten(1))


class Pools(Head):
    """adaptive avg/max pool to uneven sizes, avg pool (count_include_pad both ways), max
    pool with ceil_mode."""

    def __init__(self):
        super().__init__(8 * (9 + 12 + 16 + 16 + 9 + 1))
        self.amax = nn.AdaptiveMaxPool2d((3, 4))

    def body(self, y):
        parts = [
            F.adaptive_avg_pool2d(y, 3),
            self.amax(y),
            F.avg_pool2d(y, 3, 2, 1, count_include_pad=True),
            F.avg_pool2d(y, 3, 2, 1, count_include_pad=False),
            F.max_pool2d(y, 3, 3, ceil_mode=True),
            y.mean((2, 3), keepdim=True),
        ]
        return torch.cat([p.flatten(2) for p in parts], dim=2)


class Resample(Head):
    """interpolate (nearest, bilinear, align_corners both), pixel_shuffle, channel shuffle,
    pad (constant, reflect, replicate), roll, repeat, expand."""

    def __init__(self):
        super().__init__(8 * 8 * 8)

    def body(self, y):
        small = F.avg_pool2d(y, 2)  # 8 x 4 x 4
        a = F.interpolate(small, scale_factor=2, mode="nearest")
        b = F.interpolate(small, size=(8, 8), mode="bilinear", align_corners=False)
        c = F.interpolate(small, size=(8, 8), mode="bilinear", align_corners=True)
        d = F.pixel_shuffle(torch.cat([small, small * 0.5, b[:, :, ::2, ::2], -small], 1), 2)
        n, ch, h, w = y.shape
        e = y.view(n, 2, ch // 2, h, w).transpose(1, 2).reshape(n, ch, h, w)  # channel shuffle
        f = F.pad(small, (2, 2, 2, 2)) + F.pad(small, (2, 2, 2, 2), mode="reflect")
        f = f + F.pad(small, (2, 2, 2, 2), mode="replicate")
        g = torch.roll(y, shifts=(1, -2), dims=(2, 3)) + y.mean(1, keepdim=True).expand(
            -1, 8, -1, -1
        )
        return a + b + c + d + e + f + g + small.repeat(1, 1, 2, 2)


class Combine(Head):
    """cat/stack of differently scaled tensors, split/chunk/unbind/slice/select, constant
    index lookups (relative position bias), broadcast mul/add/sub/div (an SE block),
    mean/sum over dims, flatten/permute."""

    def __init__(self):
        super().__init__(8 * 8 * 8 + 4 * 8 * 3)
        self.se = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 8))
        self.bias_table = nn.Parameter(torch.linspace(-1, 1, 15 * 8).reshape(15, 8))
        coords = torch.arange(8)
        self.register_buffer("index", coords[:, None] - coords[None, :] + 7, persistent=False)

    def body(self, y):
        gate = torch.sigmoid(self.se(y.mean((2, 3))))[:, :, None, None]
        y = y * gate - y.sum(dim=(2, 3), keepdim=True) / 64.0 + y / 2.0
        y = y / (y.abs().mean((2, 3), keepdim=True) + 1.0)  # a norm by a tensor
        y = y + self.bias_table[self.index].permute(2, 0, 1).unsqueeze(0)  # 8 x 8 x 8
        a, b = y.split(4, dim=1)
        c, _ = torch.chunk(y * 3.0, 2, dim=2)
        rows = torch.unbind(y[:, :4, 2:5], dim=2)  # three 4 x 8 rows
        z = torch.stack([a, b * 4.0], dim=1).flatten(1, 2)  # 8 x 8 x 8
        z = torch.cat([z[:, :, :4], c], dim=2) + y[:, 0].unsqueeze(1)  # over channels
        return torch.cat([z.flatten(1), torch.stack(rows, dim=1).flatten(1)], dim=1)


class Math(Head):
    """clamp, maximum/minimum, abs, pow 2, sqrt/rsqrt (an RMS norm), an einsum that is no
    matrix product."""

    def __init__(self):
        super().__init__(8 * 8 * 8)

    def body(self, y):
        y = y + 0.5  # the stem conv's only user: an add of a constant
        a = torch.maximum(y, y * 0.5) + torch.minimum(y, y.mean(1, keepdim=True))
        b = y.clamp(-1.0, 2.0).abs() - y.clamp(min=0.2)
        rms = torch.rsqrt(y.pow(2).mean(1, keepdim=True) + 1e-5)
        c = y * rms + torch.sqrt(y * y + 1.0) - torch.einsum("nchw,nchw->nhw", y, y)[:, None]
        return a + b + c


class Attention(nn.Module):
    """64 tokens of 16: a learned position embedding (embedding of constant indices),
    nn.MultiheadAttention, scaled_dot_product_attention, matmul/bmm/einsum."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 16)
        self.pos = nn.Embedding(64, 16)
        self.register_buffer("positions", torch.arange(64), persistent=False)
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.qkv = nn.Linear(16, 48)
        self.fc = nn.Linear(16 * 16, 5)

    def forward(self, x):
        t = self.embed(x.flatten(2).transpose(1, 2)) + self.pos(self.positions)  # B x 64 x 16
        t = t + self.mha(t, t, t, need_weights=False)[0]
        q, k, v = self.qkv(t).reshape(-1, 64, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v)
        o = o.transpose(1, 2).reshape(-1, 64, 16)
        g = torch.einsum("bnc,bmc->bnm", o[:, :16], t[:, :16])  # B x 16 x 16
        g = torch.bmm(g, o[:, :16]) + torch.matmul(o[:, 16:32], t[:, :16].transpose(1, 2))
        return self.fc(g.flatten(1))


FAMILIES = {
    "gates": Gates,
    "smooth": Smooth,
    "norms": Norms,
    "convs": Convs,
    "pools": Pools,
    "resample": Resample,
    "combine": Combine,
    "math": Math,
    "attention": Attention,
}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return FAMILIES[name]().eval()


def data(name: str) -> dict:
    """Random 4x8x8 inputs labelled by the family's model (its float top-1 is 1.0)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(48, 4, 8, 8)).astype(np.float32)
    with torch.no_grad():
        y = build(name)(torch.from_numpy(x)).argmax(1).numpy()
    return {"train": (x[:24], y[:24]), "evaluation": (x[24:], y[24:])}


def __getattr__(attr: str):
    """``gates`` and ``data_gates``, ... as spec factories."""
    name = attr.removeprefix("data_")
    if name not in FAMILIES:
        raise AttributeError(attr)
    return (lambda: data(name)) if attr.startswith("data_") else (lambda: build(name))
