"""Import torchvision and timm as they are, beside whichever torch build is installed.

Spec factories go through it (stages.loader: ``timm:create_model``,
``torchvision.models:resnet18``), and so does the zoo (examples.zoo).

The registry's ``torchvision==0.28.0`` (the release pinned to ``torch==2.13.0``) is built
against CUDA torch. Beside a CPU-only torch its compiled ops (``_C.so``: nms, roi_align...)
fail to load, and then ``import torchvision`` fails in ``torchvision/_meta_registrations.py``
with ``RuntimeError: operator torchvision::nms does not exist`` while it registers fake
kernels for those missing ops. The model definitions (``torchvision.models``) are pure
Python and need none of them. So when, and only when, that exact failure happens,
:func:`torchvision` imports the package with an empty ``_meta_registrations`` module: the
models work, the detection post-processing ops (nms, roi_align) stay unavailable, as they
already were. timm imports ``torchvision.ops.misc`` from its layers, so it goes through the
same function; a model factory runs through :func:`call`, since transformers imports
torchvision lazily, inside the factory.
"""

from __future__ import annotations

import importlib
import sys
import types

_META = "torchvision._meta_registrations"


def torchvision() -> types.ModuleType:
    """``import torchvision``, tolerating a compiled-ops library built for another torch."""
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as e:
        if not missing_compiled_ops(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules[_META] = types.ModuleType(_META)  # fake kernels of ops that were never loaded
    return importlib.import_module("torchvision")


def timm() -> types.ModuleType:
    """``import timm`` (after :func:`torchvision`, which its layers import)."""
    torchvision()
    return importlib.import_module("timm")


def missing_compiled_ops(e: BaseException | None) -> bool:
    """Whether ``e``, or an exception it was raised from, is torchvision's import failure
    over compiled ops it could not load (transformers re-raises it as a ModuleNotFoundError
    when its lazy ``BertModel`` import pulls torchvision in)."""
    for _ in range(16):  # a chain, not a cycle
        if e is None:
            return False
        if isinstance(e, RuntimeError) and "torchvision::" in str(e) and "does not exist" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def call(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)``; when it fails on torchvision's missing compiled ops (user
    code whose library imports torchvision on first use, as transformers' models do), once
    more after :func:`torchvision`."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is that one failure
        if not missing_compiled_ops(e):
            raise
    torchvision()
    return fn(*args, **kwargs)


def import_module(name: str) -> types.ModuleType:
    """``importlib.import_module(name)``; when it fails on torchvision's missing compiled
    ops (a module importing torchvision, as timm does), again after :func:`torchvision`,
    with the package's half-imported modules dropped first."""
    try:
        return importlib.import_module(name)
    except RuntimeError as e:
        if not missing_compiled_ops(e):
            raise
    top = name.split(".")[0]
    for mod in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[mod]
    torchvision()
    return importlib.import_module(name)
