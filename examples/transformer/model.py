"""The transformer example model: a tiny vision transformer (ViT) on the 8x8 digits.

`build()` returns a trained `DigitsViT` in eval mode. It exercises the lookup-table and
matmul ops a quantizer has to handle inside a transformer: layer norm, softmax, GELU,
activation x activation matmuls (``q @ k^T`` and ``attn @ v``), linear, conv and adds.
Trained weights are cached as safetensors under ``examples/transformer/.cache/`` with a key
derived from the architecture source, the training code and hyperparameters, and the torch
major.minor version, so any of those changing retrains on the next call. Training is
deterministic and uses the train split of `examples.digits.data.load` only.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples import weights
from examples.digits import data

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
DIM = 32
HEADS = 2
DEPTH = 2
PATCH = 2
HYPERPARAMETERS = {
    "seed": 0,
    "epochs": 120,
    "batch_size": 64,
    "lr": 5e-3,
    "weight_decay": 5e-2,
}


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``.

    The attention linears are attributes of the block itself (``q``, ``k``, ``v``,
    ``proj``), so their module paths read ``blocks.<i>.q`` and so on.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        """[B, N, D] -> [B, H, N, D / H] (batch left as ``-1``)."""
        return t.reshape(-1, t.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Explicit multi-head self-attention: ``proj(softmax(q k^T * scale) v)``."""
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = q @ k.transpose(-2, -1) * self.scale
        attn = torch.softmax(scores, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(-1, x.shape[1], x.shape[2])
        return self.proj(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attention and MLP sub-blocks, each with a residual add."""
        x = x + self.attention(self.ln1(x))
        h = nn.functional.gelu(self.fc1(self.ln2(x)))
        return x + self.fc2(h)


class DigitsViT(nn.Module):
    """Tiny ViT for 1x8x8 digits, 10 classes; returns logits from the linear ``head``.

    Layout (module paths): ``patch`` Conv2d(1, D, 2, stride 2) -> 16 tokens of width D,
    plus the learned position embedding ``pos`` -> ``blocks.0``, ``blocks.1`` (each
    ``ln1``, ``q``/``k``/``v``/``proj``, ``ln2``, ``fc1``/``fc2``) -> ``norm`` -> mean
    over tokens -> ``head`` (D -> 10).
    """

    def __init__(self, dim: int = DIM, heads: int = HEADS, depth: int = DEPTH) -> None:
        super().__init__()
        tokens = (8 // PATCH) ** 2
        self.patch = nn.Conv2d(1, dim, PATCH, stride=PATCH)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.ModuleList(EncoderBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a (N, 1, 8, 8) batch to (N, 10) logits."""
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def build_untrained(seed: int = 0) -> DigitsViT:
    """Return a `DigitsViT` with a seeded random init, in eval mode (global RNG untouched)."""
    return weights.untrained(DigitsViT, seed)


@functools.cache
def cache_key() -> str:
    """Short sha256 of the architecture and training source, hyperparameters, torch version.

    Computed once per process (the source does not change while it runs).
    """
    objects = (EncoderBlock, DigitsViT, _make_optimizer, _train, data.load)
    return weights.source_key(
        (*objects, weights.single_thread, weights.fit),
        HYPERPARAMETERS,
        shape={"dim": DIM, "heads": HEADS, "depth": DEPTH, "patch": PATCH},
    )


def cache_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return where `build()` caches the trained weights (``digits_vit-<key>.safetensors``)."""
    return weights.cache_file(CACHE_DIR, cache_dir, "digits_vit", cache_key())


def _make_optimizer(model: nn.Module, hp: dict) -> torch.optim.Optimizer:
    """AdamW with weight decay on weight matrices/kernels only (not biases, norms, ``pos``)."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and n != "pos"]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or n == "pos"]
    groups = [
        {"params": decay, "weight_decay": hp["weight_decay"]},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=hp["lr"])


def _train(x: np.ndarray, y: np.ndarray, hp: dict) -> DigitsViT:
    """Train a fresh `DigitsViT` deterministically with AdamW + one-cycle schedule on (x, y),
    on one intra-op thread; return it in eval mode."""
    with torch.random.fork_rng(devices=[]), weights.single_thread():
        torch.manual_seed(hp["seed"])
        model = DigitsViT()
        optimizer = _make_optimizer(model, hp)
        steps = hp["epochs"] * -(-len(x) // hp["batch_size"])
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, hp["lr"], total_steps=steps)
        return weights.fit(model, optimizer, x, y, hp, step_schedule=schedule)


def build(cache_dir: str | os.PathLike[str] | None = None) -> DigitsViT:
    """Return a trained `DigitsViT` in eval mode, training and caching it on a cache miss.

    Weights live at `cache_path(cache_dir)` (default ``examples/transformer/.cache/``) and
    are loaded with ``safetensors.torch.load_file`` (no pickle).
    """
    return weights.load_or_train(
        cache_path(cache_dir),
        cache_key(),
        DigitsViT,
        lambda: _train(*data.load()["train"], HYPERPARAMETERS),
    )
