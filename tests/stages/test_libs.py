"""torchvision and timm beside a torch whose build torchvision's compiled ops do not fit
(stages.libs): the models build, and a spec naming timm's own factory imports."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CUDA_BUILT_TORCHVISION = textwrap.dedent(
    """
    import torch
    real = torch.ops.load_library
    def load_library(path):
        if "torchvision" in str(path):
            raise OSError("libcudart.so.13: cannot open shared object file")
        return real(path)
    torch.ops.load_library = load_library
    """
)
"""A script's start: torchvision's compiled ops fail to load, as the registry's CUDA build
does beside the CPU torch."""


def _run(script: str) -> subprocess.CompletedProcess:
    """The script in a fresh interpreter at the repository root; it must succeed."""
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_torchvision_and_a_timm_factory_import_beside_a_torch_whose_compiled_ops_fail():
    """As with the registry's CUDA-built torchvision beside the CPU torch: _C.so fails to
    load, then torchvision's fake-kernel registrations fail; the models still build, and
    the spec loader imports ``timm:create_model`` (timm imports torchvision)."""
    script = CUDA_BUILT_TORCHVISION + textwrap.dedent(
        """
        try:
            import timm  # noqa: F401
            raise SystemExit("expected the plain import to fail")
        except RuntimeError as e:
            assert "torchvision::nms" in str(e), e
        from stages.loader import import_object
        create = import_object("timm:create_model", field="model.factory")
        net = create("resnet10t", num_classes=3, pretrained=False).eval()
        from stages import libs
        tv = libs.torchvision()
        out = tv.models.mobilenet_v3_small(num_classes=3).eval()(torch.randn(1, 3, 32, 32))
        print(tuple(net(torch.randn(1, 3, 32, 32)).shape), tuple(out.shape))
        """
    )
    proc = _run(script)
    assert proc.stdout.strip().endswith("(1, 3) (1, 3)")


def test_a_factory_whose_library_imports_torchvision_inside_it_builds():
    """transformers imports torchvision on first use of BertModel, inside the factory, and
    re-raises the compiled-ops failure as a ModuleNotFoundError: the factory fails when
    called plainly and builds through build_float (stages.libs.call)."""
    script = CUDA_BUILT_TORCHVISION + textwrap.dedent(
        """
        from examples.bert import model
        small = dict(layers=1, hidden=32, heads=2, intermediate=64)
        try:
            model.build(**small)
            raise SystemExit("expected the plain factory call to fail")
        except ModuleNotFoundError as e:
            from stages import libs
            assert libs.missing_compiled_ops(e), e
        from stages.modelio import build_float
        net = build_float("examples.bert.model:build", kwargs=small)
        print(type(net).__name__)
        """
    )
    proc = _run(script)
    assert proc.stdout.strip().endswith("SentenceEncoder")
