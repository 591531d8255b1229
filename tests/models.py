"""Tiny models and datasets the tests name in specs (``tests.models:...``).

Small, seeded and instant: they exercise the chain without training.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class TinyNet(nn.Module):
    """conv-bn-relu, a residual add, max-pool, sigmoid gate, linear head: the digits shape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(y + self.conv2(y))
        y = self.pool(y) * torch.sigmoid(y.mean((2, 3), keepdim=True))
        return self.head(y.flatten(1))


class CumsumNet(TinyNet):
    """Uses cumsum, which qparity does not model: prepare must refuse it by name."""

    def forward(self, x):
        return super().forward(torch.cumsum(x, dim=2))


class BranchyNet(TinyNet):
    """Data-dependent Python control flow: torch.export cannot trace it."""

    def forward(self, x):
        if x.sum() > 0:
            return super().forward(x)
        return super().forward(-x)


def _seeded(cls):
    torch.manual_seed(0)
    m = cls()
    with torch.no_grad():  # non-trivial BN statistics, so folding is visible
        m.bn.running_mean.uniform_(-0.2, 0.2)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def tiny() -> nn.Module:
    return _seeded(TinyNet)


def cumsum() -> nn.Module:
    return _seeded(CumsumNet)


def branchy() -> nn.Module:
    return _seeded(BranchyNet)


def _labelled_by(model: nn.Module) -> dict:
    """Random 1x8x8 inputs labelled by ``model`` (eval mode), so its float top-1 is 1.0."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(160, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        y = model.eval()(torch.from_numpy(x)).argmax(1).numpy()
    return {"train": (x[:96], y[:96]), "evaluation": (x[96:], y[96:])}


def data() -> dict:
    """Random inputs labelled by the tiny net."""
    return _labelled_by(tiny())


def unlabelled_data() -> dict:
    """The tiny net's inputs in the v2 split form, without labels (judged by agreement)."""
    d = data()
    return {k: {"inputs": {"x": x}, "labels": None} for k, (x, _) in d.items()}


def aux_data() -> dict:
    """Random inputs labelled by the aux-branch net's deploy (eval) branch."""
    return _labelled_by(aux_branch())


def table_data() -> dict:
    """Random inputs labelled by the table-op net."""
    return _labelled_by(tables())


def residual_mlp() -> nn.Module:
    torch.manual_seed(0)
    return ResidualMlpNet().eval()


def residual_mlp_data() -> dict:
    """Random inputs labelled by the residual MLP net."""
    return _labelled_by(residual_mlp())


def nan_data() -> dict:
    """Like data(), with a NaN in evaluation sample 7."""
    d = data()
    x, y = d["evaluation"]
    x = x.copy()
    x[7, 0, 3, 3] = np.nan
    return {"train": d["train"], "evaluation": (x, y)}


class AuxNet(TinyNet):
    """A train-only branch (deep-supervision style): in qat.pt, absent from the deploy graph."""

    def __init__(self):
        super().__init__()
        self.aux = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        if self.training:
            y = y + 3.0 * self.aux(y)
        y = torch.relu(y + self.conv2(y))
        y = self.pool(y) * torch.sigmoid(y.mean((2, 3), keepdim=True))
        return self.head(y.flatten(1))


class TableNet(nn.Module):
    """Table ops of several kinds after a conv: sigmoid, tanh, exp, gelu, silu, softmax, LN."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(4 * 16, 10)

    def forward(self, x):
        y = self.conv(x)[:, :, ::2, ::2].flatten(2)  # B x 4 x 16
        y = torch.sigmoid(y) + torch.tanh(y) + torch.exp(-y.abs())
        y = nn.functional.gelu(y) + nn.functional.silu(y)
        y = self.ln(y) + torch.softmax(y, dim=-1)
        return self.head(y.flatten(1))


class ResidualMlpNet(nn.Module):
    """A transformer's MLP sub-block on 4 tokens of 16: ``y + fc2(gelu(fc1(y)))``. fc2 feeds
    only the add, so it keeps its int32 accumulator and compile fuses the two."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.head = nn.Linear(4 * 16, 10)

    def forward(self, x):
        y = self.conv(x)[:, :, ::2, ::2].flatten(2)  # B x 4 x 16
        y = y + self.fc2(nn.functional.gelu(self.fc1(y)))
        return self.head(y.flatten(1))


def aux_branch() -> nn.Module:
    m = _seeded(AuxNet)
    torch.manual_seed(1)
    nn.init.normal_(m.aux.weight, std=1.0)
    return m


def tables() -> nn.Module:
    torch.manual_seed(0)
    return TableNet().eval()


class RgbNet(nn.Module):
    """TinyNet for 3-channel 8x8 frames (board input tests)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def rgb() -> nn.Module:
    torch.manual_seed(0)
    return RgbNet().eval()


def camera_data() -> dict:
    """Random RGB camera frames, normalized x = (pixel - 127.5) / 127.5, labelled by rgb()."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(160, 8, 8, 3), dtype=np.uint8)
    x = np.ascontiguousarray((frames.astype(np.float32) - 127.5) / 127.5).transpose(0, 3, 1, 2)
    x = np.ascontiguousarray(x)
    with torch.no_grad():
        y = rgb()(torch.from_numpy(x)).argmax(1).numpy()
    return {
        "train": (x[:96], y[:96]),
        "evaluation": (x[96:], y[96:]),
        "camera_evaluation": frames[96:],
    }


class IslandNet(nn.Module):
    """What trained nets in packages end with: a GroupNorm (a float island: convert has
    no integer form of it) and a final softmax as the model output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return torch.softmax(self.fc(self.gn(self.conv(x)).flatten(1)), dim=1)


def islands() -> nn.Module:
    torch.manual_seed(0)
    return IslandNet().eval()


def island_data() -> dict:
    """Random inputs labelled by the island net."""
    return _labelled_by(islands())


class LayerScaleNet(nn.Module):
    """ConvNeXt's layer scale: a parameter reshaped in forward, a layer without a batch dim."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.fc((self.conv(x) * self.gamma.reshape(1, -1, 1, 1)).flatten(1))


def layer_scale() -> nn.Module:
    torch.manual_seed(0)
    return LayerScaleNet().eval()


def layer_scale_data() -> dict:
    """Random inputs labelled by the layer-scale net."""
    return _labelled_by(layer_scale())


class ClassTokenNet(nn.Module):
    """A ViT's class token as timm and torchvision write it (expanded to the batch), a
    token-mixing linear, and a head on the class token."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(1, 8, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 8) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, 5, 8) * 0.1)
        self.mix = nn.Linear(5, 5)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.mix(x.transpose(1, 2)).transpose(1, 2)
        return self.head(x[:, 0])


def class_token() -> nn.Module:
    torch.manual_seed(0)
    return ClassTokenNet().eval()


def class_token_data() -> dict:
    """Random inputs labelled by the class-token net."""
    return _labelled_by(class_token())


class TwoHeadNet(nn.Module):
    """A shared conv trunk and two heads returned as a tuple: class scores (10) and a box
    regression (4), the box head first as a detector writes it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.act = nn.PReLU(4)
        self.box = nn.Linear(4 * 8 * 8, 4)
        self.cls = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        y = self.act(self.conv(x)).flatten(1)
        return self.box(y), self.cls(y)


class DictHeadNet(TwoHeadNet):
    """The two heads returned as a dict, the class scores nested in a tuple."""

    def forward(self, x):
        box, cls = super().forward(x)
        return {"boxes": box, "scores": (cls,)}


class BadLeafNet(TwoHeadNet):
    """Returns a string next to a tensor: not an output qparity can carry."""

    def forward(self, x):
        box, _ = super().forward(x)
        return {"boxes": box, "name": "face"}


def two_heads() -> nn.Module:
    torch.manual_seed(0)
    return TwoHeadNet().eval()


def dict_heads() -> nn.Module:
    torch.manual_seed(0)
    return DictHeadNet().eval()


def bad_leaf() -> nn.Module:
    torch.manual_seed(0)
    return BadLeafNet().eval()


def two_head_data() -> dict:
    """Random 1x8x8 inputs labelled by the two-head net's class scores."""
    x = np.random.default_rng(0).uniform(-1, 1, size=(160, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        y = two_heads()(torch.from_numpy(x))[1].argmax(1).numpy()
    return {k: {"inputs": {"x": x[s]}, "labels": y[s]}
            for k, s in (("train", slice(0, 96)), ("evaluation", slice(96, None)))}  # fmt: skip


class TokensNet(nn.Module):
    """A text encoder's inputs: int64 token ids (embedding) and an int64 attention mask
    (``(1 - mask) * -1e4`` added to the scores, the large-negative add of BERT-style
    encoders), pooled by a softmax over the tokens into class scores."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.score = nn.Linear(8, 1)
        self.head = nn.Linear(8, 5)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids)
        scores = self.score(h).squeeze(-1) + (1 - attention_mask) * -1e4
        weights = torch.softmax(scores, dim=-1).unsqueeze(-1)
        return self.head((weights * h).sum(1))


def tokens() -> nn.Module:
    torch.manual_seed(0)
    return TokensNet().eval()


def tokens_data() -> dict:
    """Random token ids (N, 6) with masks keeping 3-6 tokens, unlabelled."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, size=(160, 6))
    mask = (np.arange(6) < rng.integers(3, 7, size=(160, 1))).astype(np.int64)
    return {k: {"inputs": {"input_ids": ids[s], "attention_mask": mask[s]}, "labels": None}
            for k, s in (("train", slice(0, 96)), ("evaluation", slice(96, None)))}  # fmt: skip


class MaskedMeanNet(TokensNet):
    """The token inputs pooled by a masked mean (no large-negative add)."""

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        return self.head(h.sum(1) / attention_mask.sum(1, keepdim=True))


def masked_mean() -> nn.Module:
    torch.manual_seed(0)
    return MaskedMeanNet().eval()


def shallow_swin_t() -> nn.Module:
    """torchvision's own SwinTransformer as ``swin_t`` configures it (patch 4, dim 96, heads
    3-24, window 7, stochastic depth 0.2), 2-1-1-1 blocks deep instead of 2-2-6-2: at 32 x 32
    the shifted-window block with its in-place-built mask (stage 1, the only stage wider
    than a window) and every patch merging stay, at about half of the tracing time."""
    from examples.zoo import libs
    from examples.zoo.models import CLASSES

    swin = libs.torchvision().models.swin_transformer
    torch.manual_seed(0)
    return swin.SwinTransformer(
        patch_size=[4, 4], embed_dim=96, depths=[2, 1, 1, 1], num_heads=[3, 6, 12, 24],
        window_size=[7, 7], stochastic_depth_prob=0.2, num_classes=CLASSES,
    ).eval()  # fmt: skip
