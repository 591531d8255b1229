"""Corrupt, truncated and tampered files for the catalog (tests/catalog/test_bad_inputs.py).

Every case works on a scratch copy: the complete run of the catalog is never changed.
"""

from __future__ import annotations

import shutil

from schemas.artifacts import CalibratedModel, HbmModel
from schemas.errors import ArtifactError, SimulatorError, StageError
from schemas.store import RunStore

ONNX = "artifacts/export/qat.onnx"
QUANT = "artifacts/convert/quantized.onnx"
HBM = "artifacts/compile/model.hbm"
STATE = "artifacts/calibrate/qat.safetensors"


def _bytes(env, rel: str, edit) -> str:
    """A scratch copy of ``rel`` with its bytes edited; returns its path."""
    path = env.copy_of(rel)
    path.write_bytes(edit(path.read_bytes()))
    return path


def _onnx(env, rel, edit):
    from stages.onnx_runner import OnnxRunner

    return OnnxRunner(_bytes(env, rel, edit))


def _hbm(env, edit):
    from simulator.program import hbm

    return hbm.load(_bytes(env, HBM, edit))


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def _copied_run(env):
    """A scratch copy of the whole run in a store of its own."""
    dst = env.tmp / "store" / env.run_id
    shutil.rmtree(dst.parent, ignore_errors=True)
    shutil.copytree(env.run.root, dst)
    return RunStore(dst.parent).open(env.run_id)


def _tampered_artifact(env, rel, cls, stage):
    run = _copied_run(env)
    path = run.path(rel)
    path.write_bytes(_flip(path.read_bytes(), len(path.read_bytes()) // 2))
    return run.load_artifact(stage, cls)


def _truncated_state(env):
    import torch

    from stages.modelio import load_weights

    path = _bytes(env, STATE, lambda b: b[: len(b) // 3])
    return load_weights(torch.nn.Linear(2, 2), path, field="artifact qat.safetensors")


def _corrupt_parquet(env):
    from schemas.tables import read_run_table

    run = _copied_run(env)
    path = next(run.path("tables/metrics").glob("*.parquet"))
    path.write_bytes(path.read_bytes()[:40])
    return read_run_table(run, "metrics")


def cases() -> dict:
    return {
        "onnx random bytes": (lambda e: _onnx(e, ONNX, lambda b: bytes(range(256)) * 4),
                              StageError, "qat.onnx"),
        "onnx truncated": (lambda e: _onnx(e, ONNX, lambda b: b[: len(b) // 2]), StageError,
                           "qat.onnx"),
        "text file as onnx": (lambda e: _onnx(e, QUANT, lambda b: b"not a model\n"), StageError,
                              "quantized.onnx"),
        "hbm truncated": (lambda e: _hbm(e, lambda b: b[: len(b) // 2]), SimulatorError,
                          "model.hbm"),
        "hbm corrupted byte": (lambda e: _hbm(e, lambda b: _flip(b, len(b) - 10)),
                               SimulatorError, "model.hbm"),
        "hbm wrong version": (lambda e: _hbm(e, lambda b: _bump_version(b)), SimulatorError,
                              "version"),
        "hbm empty": (lambda e: _hbm(e, lambda b: b""), SimulatorError, "model.hbm"),
        "safetensors tampered": (lambda e: _tampered_artifact(e, STATE, CalibratedModel,
                                 "calibrate"), ArtifactError, "qat.safetensors"),
        "hbm tampered in a run": (lambda e: _tampered_artifact(e, HBM, HbmModel, "compile"),
                                  ArtifactError, "model.hbm"),
        "safetensors truncated": (lambda e: _truncated_state(e), ArtifactError,
                                  "qat.safetensors"),
        "parquet truncated": (lambda e: _corrupt_parquet(e), ArtifactError, ".parquet"),
    }  # fmt: skip


def _bump_version(data: bytes) -> bytes:
    """The same file claiming the next format version (the version follows the magic)."""
    from simulator.program import hbm

    magic = hbm.MAGIC
    at = data.index(magic) + len(magic)
    return data[:at] + bytes([data[at] + 1]) + data[at + 1 :]
