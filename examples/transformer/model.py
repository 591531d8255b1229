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

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from examples.digits import data

log = logging.getLogger(__name__)

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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DigitsViT()
    return model.eval()


@functools.cache
def cache_key() -> str:
    """Short sha256 of the architecture and training source, hyperparameters, torch version.

    Computed once per process (the source does not change while it runs).
    """
    objects = (EncoderBlock, DigitsViT, _single_thread, _make_optimizer, _train, data.load)
    sources = [inspect.getsource(obj) for obj in objects]
    torch_version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    payload = json.dumps(
        {
            "sources": sources,
            "shape": {"dim": DIM, "heads": HEADS, "depth": DEPTH, "patch": PATCH},
            "hyperparameters": HYPERPARAMETERS,
            "torch": torch_version,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cache_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return where `build()` caches the trained weights (``digits_vit-<key>.safetensors``)."""
    folder = Path(cache_dir) if cache_dir is not None else CACHE_DIR
    return folder / f"digits_vit-{cache_key()}.safetensors"


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """Run the body with one intra-op torch thread, restoring the previous count after.

    The tensors are tiny, so extra threads only add synchronisation; on a busy two-core
    machine two threads were measured 5x slower than one.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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
    """Train a fresh `DigitsViT` deterministically with AdamW on (x, y); return it in eval mode."""
    with torch.random.fork_rng(devices=[]), _single_thread():
        torch.manual_seed(hp["seed"])
        shuffle = torch.Generator().manual_seed(hp["seed"])
        model = DigitsViT().train()
        optimizer = _make_optimizer(model, hp)
        steps = hp["epochs"] * -(-len(x) // hp["batch_size"])
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, hp["lr"], total_steps=steps)
        inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
        for _ in range(hp["epochs"]):
            order = torch.randperm(len(x), generator=shuffle)
            for start in range(0, len(x), hp["batch_size"]):
                idx = order[start : start + hp["batch_size"]]
                loss = nn.functional.cross_entropy(model(inputs[idx]), targets[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
    return model.eval()


def _save_atomic(model: nn.Module, path: Path) -> None:
    """Write the model's state dict as safetensors via a temp file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(state, tmp, metadata={"cache_key": cache_key()})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@torch.no_grad()
def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``model`` on (x, y)."""
    logits = model(torch.from_numpy(x))
    return float((logits.argmax(1) == torch.from_numpy(y)).float().mean())


def build(cache_dir: str | os.PathLike[str] | None = None) -> DigitsViT:
    """Return a trained `DigitsViT` in eval mode, training and caching it on a cache miss.

    Weights live at `cache_path(cache_dir)` (default ``examples/transformer/.cache/``) and
    are loaded with ``safetensors.torch.load_file`` (no pickle).
    """
    path = cache_path(cache_dir)
    if path.exists():
        model = DigitsViT()
        model.load_state_dict(load_file(path), strict=True)
        return model.eval()
    x, y = data.load()["train"]
    model = _train(x, y, HYPERPARAMETERS)
    _save_atomic(model, path)
    log.info("trained digits ViT, cached at %s", path)
    return model
