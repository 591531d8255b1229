"""Shared weight-cache and training plumbing for the bundled example models.

Each example trains a small model deterministically and caches the weights as safetensors
under a file name carrying `source_key`: a short hash of the architecture and training
source, the hyperparameters and the torch major.minor version, so any of those changing
retrains on the next `load_or_train`. Weights load with ``safetensors.torch.load_file``
(no pickle) and are written atomically (``schemas.fileio.atomic_save``).

The trained files ship with the project in ``examples/weights/`` (:data:`SHIPPED`, about
250 KB), so a fresh clone's demo and tests load them instead of training (about 70 s on 2
cores). A file there is used only under its exact name, so a change to a model's training
source or hyperparameters (a new key) trains again; ``python -m examples.weights``
rewrites the folder, and tests/examples/test_weights.py fails while it is stale.

Training is bit-reproducible on one machine, not across instruction sets: torch's float
kernels sum in another order on AVX-512 than on AVX2, and the weights come out a few ulps
apart. The shipped files are also what makes two machines' runs of an example agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from schemas.fileio import atomic_save, atomic_writer

log = logging.getLogger(__name__)
SHIPPED = Path(__file__).resolve().parent / "weights"
"""The trained files that ship with the project, named as in the caches."""

M = TypeVar("M", bound=nn.Module)


def source_key(objects: Iterable[object], hyperparameters: Mapping[str, Any], **extra: Any) -> str:
    """Short sha256 of the source of ``objects`` (classes, functions or modules), the
    ``hyperparameters``, any JSON-able ``extra`` fields and the torch major.minor version."""
    sources = [inspect.getsource(obj) for obj in objects]
    torch_version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    payload = json.dumps(
        {"sources": sources, "hyperparameters": hyperparameters, "torch": torch_version, **extra},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cache_file(
    default_dir: Path, cache_dir: str | os.PathLike[str] | None, stem: str, key: str
) -> Path:
    """``<cache_dir or default_dir>/<stem>-<key>.safetensors``."""
    folder = Path(cache_dir) if cache_dir is not None else default_dir
    return folder / f"{stem}-{key}.safetensors"


def untrained(make: Callable[[], M], seed: int) -> M:
    """``make()`` under ``torch.manual_seed(seed)``, in eval mode (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make()
    return model.eval()


def save_atomic(model: nn.Module, path: Path, key: str) -> None:
    """Write the model's state dict as safetensors through the store's atomic writer."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_save(path, lambda tmp: save_file(state, tmp, metadata={"cache_key": key}))


def load_or_train(path: Path, key: str, make: Callable[[], M], train: Callable[[], M]) -> M:
    """Load ``make()``'s weights from ``path`` if it exists, else from the shipped file of
    the same name, else ``train()`` and cache the result at ``path`` (metadata
    ``cache_key=key``). Returns the model in eval mode."""
    for source in (path, SHIPPED / path.name):
        if source.exists():
            model = make()
            model.load_state_dict(load_file(source), strict=True)
            return model.eval()
    model = train()
    save_atomic(model, path, key)
    log.info("trained %s, cached at %s", type(model).__name__, path)
    return model.eval()


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run the body with one intra-op torch thread, restoring the previous count after.

    The example tensors are tiny, so extra threads only add synchronisation (on a busy
    two-core machine two threads were measured 5x slower than one), and one thread keeps
    training bit-stable across machines.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def fit(
    model: M,
    optimizer: torch.optim.Optimizer,
    x: np.ndarray,
    y: np.ndarray,
    hp: Mapping[str, Any],
    *,
    epoch_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
    step_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
    augment: Callable[[np.ndarray], np.ndarray] | None = None,
) -> M:
    """Minibatch cross-entropy training of ``model`` on (x, y); returns it in eval mode.

    Each of ``hp["epochs"]`` epochs visits (x, y) in an order drawn from a generator seeded
    with ``hp["seed"]``, in batches of ``hp["batch_size"]``; ``augment`` (if given) maps
    each numpy batch first. ``step_schedule`` steps after every batch, ``epoch_schedule``
    after every epoch. Seed the global torch RNG (model init) before calling.
    """
    model.train()
    shuffle = torch.Generator().manual_seed(hp["seed"])
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(hp["epochs"]):
        order = torch.randperm(len(x), generator=shuffle)
        for start in range(0, len(x), hp["batch_size"]):
            idx = order[start : start + hp["batch_size"]]
            batch = inputs[idx] if augment is None else torch.from_numpy(augment(x[idx.numpy()]))
            loss = nn.functional.cross_entropy(model(batch), targets[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step_schedule is not None:
                step_schedule.step()
        if epoch_schedule is not None:
            epoch_schedule.step()
    return model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``model`` on (x, y)."""
    logits = model(torch.from_numpy(x))
    return float((logits.argmax(1) == torch.from_numpy(y)).float().mean())


def example_caches() -> dict[str, tuple[Callable[..., Path], Callable[..., nn.Module]]]:
    """Each bundled example's ``cache_path(cache_dir)`` and ``build(cache_dir)``, by name."""
    from examples.colour import model as colour
    from examples.digits import model as digits
    from examples.transformer import model as transformer

    return {
        "digits": (digits.cache_path, digits.build),
        "transformer": (transformer.cache_path, transformer.build),
        "colour_rgb": (lambda d=None: colour.cache_path("rgb", d), colour.build_rgb),
        "colour_yuv444": (lambda d=None: colour.cache_path("yuv444", d), colour.build_yuv444),
    }


def ship(folder: Path = SHIPPED) -> list[Path]:
    """Train every example whose current file ``folder`` lacks (into a scratch cache), copy
    it into ``folder`` and remove the files no example names any more. Returns the files."""
    import tempfile

    keep = []
    with tempfile.TemporaryDirectory() as scratch:
        for cache_path, build in example_caches().values():
            target = folder / cache_path(scratch).name
            if not target.exists():
                build(scratch)  # trains, unless SHIPPED (another folder) has the file
                made = cache_path(scratch)
                data = (made if made.exists() else SHIPPED / made.name).read_bytes()
                folder.mkdir(parents=True, exist_ok=True)
                with atomic_writer(target) as fh:
                    fh.write(data)
            keep.append(target)
    for stale in set(folder.glob("*.safetensors")) - set(keep):
        stale.unlink()
    return keep


if __name__ == "__main__":
    for shipped in ship():
        print(shipped)
