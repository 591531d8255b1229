"""Programs and executors that disagree with their reference, for the catalog
(tests/catalog/test_bad_inputs.py): compile's and board_sim's exactness checks
(stages/exactness.py) must stop them naming the layer, output, path or batch.

Every case reads the complete run of the catalog and edits copies in memory only.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np
import pytest

from schemas.artifacts import QuantizedModel
from schemas.errors import StageError

HBM = "artifacts/compile/model.hbm"


def _parts(env):
    """(program, quantized artifact, evaluation inputs) of the catalog's run."""
    from simulator.program import hbm
    from tests.models import data

    quantized = env.run.load_artifact("convert", QuantizedModel)
    return hbm.load(env.run.path(HBM)), quantized, data()["evaluation"][0]


def _exact(env, edit):
    from stages.exactness import check_exact

    program, quantized, x = _parts(env)
    return check_exact(edit(program), env.run.root, quantized, x[:4], "compile")


def _evaluation(env, rows=(48,), broken=None, reference=None):
    """check_evaluation on batches of ``rows`` samples with ``broken(program)`` (a context
    that breaks a path) patched in."""
    from simulator.runtime.executor import Executor
    from stages.exactness import check_evaluation
    from stages.onnx_runner import OnnxRunner

    program, quantized, x = _parts(env)
    runner = OnnxRunner(env.run.path(quantized.onnx_file))
    feeds, start = [], 0
    for n in rows:
        feeds.append({"x": x[start : start + n]})
        start += n
    reference = reference or (lambda feed: runner.run(feed["x"]))
    with broken(program) if broken else _nothing():
        return check_evaluation(Executor(program), feeds, reference, "compile")


@contextmanager
def _nothing():
    yield


def _off_by_one(ys):
    ys = [ys[0].clone(), *ys[1:]]
    ys[0].view(-1)[0] += 1
    return ys


@contextmanager
def _frozen_off(program):
    from simulator.runtime.frozen import Frozen

    run = Frozen.run

    def off(self, xs, timings=None):
        outs = run(self, xs, timings)
        if outs is not None:
            name = next(iter(outs))
            outs[name] = _off_by_one([outs[name]])[0]
        return outs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Frozen, "run", off)
        yield


@contextmanager
def _replays_off(program):
    """The replayed instruction that writes the program's output one off."""
    from simulator.runtime.replay import Replays

    calls = Replays._calls

    def off(self, i, instr, state, xs):
        ys = calls(self, i, instr, state, xs)
        last = set(instr.outputs) & set(program.outputs)
        return _off_by_one(ys) if ys is not None and last else ys

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Replays, "_calls", off)
        yield


def _last_kernel_off_on(rows: int):
    """A context for ``program``: the instruction writing its output one off, only on
    batches of ``rows`` samples (another geometry than the first batch's)."""

    @contextmanager
    def broken(program):
        from simulator.runtime import executor

        with pytest.MonkeyPatch.context() as mp:
            for op, real in list(executor.KERNELS.items()):

                def off(instr, bufs, consts, real=real):
                    ys = real(instr, bufs, consts)
                    last = set(instr.outputs) & set(program.outputs)
                    return _off_by_one(ys) if last and ys[0].shape[0] == rows else ys

                mp.setitem(executor.KERNELS, op, off)
            yield

    return broken


def _ghost(program):
    return dataclasses.replace(program, captures={**program.captures, "ghost": "output"})


def _phantom(program):
    first = dataclasses.replace(program.instructions[0], layer_ids=("phantom",))
    return dataclasses.replace(program, instructions=[first, *program.instructions[1:]])


def _extra_output(program):
    return dataclasses.replace(program, outputs={**program.outputs, "extra": {}})


def _scaled_multiplier(program):
    from simulator.program.isa import Op

    conv = next(i for i in program.instructions if i.op is Op.CONV)
    consts = dict(program.constants)
    consts[conv.consts[2]] = consts[conv.consts[2]] * 2  # the requantize multipliers
    return dataclasses.replace(program, constants=consts)


def _wrong_shape(feed):
    return [np.zeros((1, 1), np.float32)]


def cases() -> dict:
    """The evaluation cases that break a replay or the frozen plan need the compiled
    kernels (no replays without them)."""
    from simulator.runtime import native

    fast = native.library() is not None
    return {
        "program captures a layer quantized.onnx lacks": (
            lambda e: _exact(e, _ghost), StageError, "ghost"),
        "program debug map names an unknown layer": (
            lambda e: _exact(e, _phantom), StageError, "phantom"),
        "program has one output more than quantized.onnx": (
            lambda e: _exact(e, _extra_output), StageError, "outputs"),
        "program requantizes with doubled multipliers": (
            lambda e: _exact(e, _scaled_multiplier), StageError, "kernels"),
        **({"evaluation frozen plan one value off": (
            lambda e: _evaluation(e, broken=_frozen_off), StageError,
            "frozen plan path, the evaluation's batch of 48"),
        "evaluation replays one value off": (
            lambda e: _evaluation(e, broken=_replays_off), StageError, "replays path"),
        } if fast else {}),
        "evaluation last smaller batch wrong on its kernels": (
            lambda e: _evaluation(e, rows=(48, 16), broken=_last_kernel_off_on(16)),
            StageError, "batch of 16 samples"),
        "evaluation reference of another shape": (
            lambda e: _evaluation(e, reference=_wrong_shape), StageError, "has shape"),
    }  # fmt: skip
