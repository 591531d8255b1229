"""Hostile inputs of ``qparity edit``, ``qparity diff`` and convert's multipliers (#22
items 24-26) for the catalog (tests/catalog/test_bad_inputs.py).

Runs are corrupted only in scratch copies and graphs only in memory: the complete run of
the catalog is never changed.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
from onnx import numpy_helper

from schemas.errors import ArtifactError, QueryError, SimulatorError, SpecError, StageError

QAT = "artifacts/export/qat.onnx"


def _edit(env, numbers: str, root=None):
    from analysis.edit_run import edit_run

    return edit_run(root or env.root, env.run_id, numbers)


def _node(env, name: str) -> str:
    """The number of the node called ``name`` in the run's qat.onnx (debug/qat_onnx.txt)."""
    nodes = onnx.load(str(env.run.path(QAT))).graph.node
    return str(next(i for i, n in enumerate(nodes) if n.name == name))


def _broken_copy(env, rel: str, damage):
    """A store holding a scratch copy of the run with ``damage(path of rel)`` done."""
    dst = env.tmp / "edit-store" / env.run_id
    shutil.rmtree(dst.parent, ignore_errors=True)
    shutil.copytree(env.run.root, dst)
    damage(dst / rel)
    return dst.parent


def _diff(env, a: str, b: str):
    from analysis.diff import diff_runs

    return diff_runs(env.root, a, b)


def _convert(env, scales: dict[str, float] | None = None, bits: int = 16):
    """Convert the run's qat.onnx with quantizer scales multiplied (``{name: factor}``)."""
    from stages.convert.graph import Converter, ConvertSettings

    model = onnx.load(str(env.run.path(QAT)))
    for init in model.graph.initializer:
        if init.name in (scales or {}):
            value = numpy_helper.to_array(init) * np.float32(scales[init.name])
            init.CopyFrom(numpy_helper.from_array(value.astype(np.float32), init.name))
    return Converter(model, ConvertSettings(multiplier_bits=bits)).run()


def _fixed(ratio, bits: int = 15):
    from simulator.arith.intmath import fixed_multiplier

    return fixed_multiplier(ratio, bits)


def _aligned(ratios):
    from simulator.arith.intmath import aligned_multipliers

    return aligned_multipliers(ratios, 15)


def edit_cases() -> dict:
    return {
        "edit with no node numbers": (lambda e: _edit(e, " , "), SpecError, "no node number"),
        "edit of a node past the graph": (lambda e: _edit(e, "9999"), SpecError, "9999"),
        "edit of a huge range": (lambda e: _edit(e, "1-" + "9" * 30), SpecError,
                                 "outside the graph's nodes"),
        "edit of a negative number": (lambda e: _edit(e, "-3"), SpecError, "'-3'"),
        "edit of a table op only": (lambda e: _edit(e, _node(e, "sigmoid")), SpecError,
                                    "Lut sigmoid"),
        "edit of a run without export": (lambda e: _edit(e, "1", _broken_copy(
            e, "artifacts/export.json", lambda p: p.unlink())), ArtifactError, "export"),
        "edit of a tampered qat.onnx": (lambda e: _edit(e, "1", _broken_copy(
            e, QAT, lambda p: p.write_bytes(b"not onnx"))), ArtifactError, "qat.onnx"),
        "edit of a run without its spec": (lambda e: _edit(e, "1", _broken_copy(
            e, "spec.yaml", lambda p: p.unlink())), SpecError, "spec.yaml"),
    }  # fmt: skip


def diff_cases() -> dict:
    return {
        "diff of an empty run id": (lambda e: _diff(e, "", e.run_id), QueryError, "''"),
        "diff of a run id with path separators": (lambda e: _diff(e, e.run_id, "../x"),
                                                  QueryError, "'../x'"),
    }  # fmt: skip


def multiplier_cases() -> dict:
    tiny_out = {"conv[output]/scale": 1e-5}  # conv's requantize ratio (~0.002) beyond 127
    return {
        "convert at 8-bit multipliers of a tiny output scale": (
            lambda e: _convert(e, tiny_out, bits=8), StageError,
            "layer conv: the req ratio of its scales is"),
        "convert of a zero quantizer scale": (
            lambda e: _convert(e, {"conv[output]/scale": 0.0}), StageError, "layer conv"),
        "convert of a NaN quantizer scale": (
            lambda e: _convert(e, {"conv[output]/scale": np.nan}), StageError, "layer conv"),
        "multiplier ratio beyond its width": (lambda e: _fixed(300.0, 7), SimulatorError,
                                              "beyond the multiplier's range"),
        "multiplier ratio infinite": (lambda e: _fixed(np.inf), SimulatorError, "not finite"),
        "multiplier ratio vanishing": (lambda e: _fixed(1e-30), SimulatorError, "too small"),
        "aligned multipliers of no ratio": (lambda e: _aligned([]), SimulatorError,
                                            "finite and positive"),
        "aligned multipliers of a zero ratio": (lambda e: _aligned([1.0, 0.0]), SimulatorError,
                                                "finite and positive"),
    }  # fmt: skip


def cases() -> dict:
    return {**edit_cases(), **diff_cases(), **multiplier_cases()}
