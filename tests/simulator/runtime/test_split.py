"""simulator.runtime.split: a batch run as chunks of samples gives the whole batch's integers,
in order, on one thread or data parallel, and a program that mixes samples runs whole."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.program.isa import Instruction, Op, Program
from simulator.runtime import native, split
from simulator.runtime.executor import Executor
from simulator.runtime.frozen import Frozen

Q = {"rounding": "half_even", "out_dtype": "int8", "relu": 0}


def _program(batch_dim=-1, mix: bool = False) -> Program:
    """quantize -> linear (a row a sample) -> dequantize over ``x: [batch, 8]``; with
    ``mix`` a Transpose first, so every output row takes one feature of every sample."""
    rng = np.random.default_rng(0)
    src = "xt" if mix else "x"
    instrs = [
        Instruction(Op.QUANTIZE, (src,), ("q",), (),
                    {"scale": 0.05, "dtype": "int8", "rounding": "half_even"}, ("quant",)),
        Instruction(Op.LINEAR, ("q",), ("l",), ("w", "b", "m", "s"), Q, ("fc",)),
        Instruction(Op.DEQUANTIZE, ("l",), ("y",), (), {"scale": [0.5]}, ("dq",)),
    ]  # fmt: skip
    if mix:
        instrs.insert(0, Instruction(Op.LAYOUT, ("x",), ("xt",), (),
                                     {"op_type": "Transpose", "perm": [1, 0]}, ("t",)))  # fmt: skip
    consts = {"w": rng.integers(-128, 128, (8, 8)).astype(np.int8), "b": np.zeros(8, np.int32),
              "m": np.array([1 << 14]), "s": np.array([20])}  # fmt: skip
    x = {"dtype": "float32", "shape": [batch_dim, 8]}
    return Program("nash-e", {"x": x}, {"y": {}}, instrs, consts,
                   captures={"quant": "q", "fc": "l", "dq": "y"})  # fmt: skip


def _batch(n: int, seed: int) -> np.ndarray:
    """``n`` distinct samples: a split that swaps or mixes them changes the outputs."""
    x = np.random.default_rng(seed).normal(0, 3, (n, 8)).astype(np.float32)
    x[:, 0] = np.arange(n) * 0.5  # no two rows alike
    return x


def _whole(prog: Program, x: np.ndarray) -> np.ndarray:
    return Executor(prog).run_batch({"x": x}, 1)[0]["y"]


@pytest.mark.parametrize(("shape", "n", "sample", "chunk", "want"), [
    ([-1, 8], 8, 32, 64, 2),        # the largest divisor of 8 within 64 bytes: 2 samples
    ([-1, 8], 6, 32, 100, 3),       # 6 samples: chunks of 3, not of 3.1
    ([-1, 8], 7, 32, 64, 1),        # a prime batch: chunks of 1
    ([-1, 8], 2, 32, 64, None),     # the whole batch fits one chunk: no split
    ([None, 8], 8, 32, 32, 1), (["batch", 8], 8, 32, 32, 1),
    ([8, 8], 8, 32, 32, None),      # a fixed batch axis: never split
    ([-1, 8], 8, 16, 32, None),     # 32 bytes a sample: not over SAMPLE_BYTES (31 here)
])  # fmt: skip
def test_chunk_size_rules(monkeypatch, shape, n, sample, chunk, want):
    monkeypatch.setattr(split, "SAMPLE_BYTES", 31 if sample == 16 else 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", chunk)
    x = np.zeros((n, sample // 4), np.float32)
    assert split.chunk_size({"x": {"shape": shape}}, {"x": x}) == want


def test_chunk_size_needs_every_input_batched_alike(monkeypatch):
    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 32)  # a sample of each input: 2 x 16 bytes
    spec = {"a": {"shape": [-1, 4]}, "b": {"shape": [-1, 4]}}
    a = np.zeros((8, 4), np.float32)
    assert split.chunk_size(spec, {"a": a, "b": a}) == 1
    assert split.chunk_size(spec, {"a": a, "b": a[:4]}) is None
    assert split.chunk_size({"a": {}}, {"a": a}) is None  # no declared shape


@pytest.mark.skipif(native.library() is None, reason=f"compiled kernels {native.status()}")
@pytest.mark.parametrize("threads", ["1", "2"], ids=["in-turn", "data-parallel"])
def test_split_runs_equal_the_whole_batch_in_order(monkeypatch, threads):
    """Through the first runs, the replays and each worker's frozen plan: the batch's
    outputs are the whole batch's, every sample in its place."""
    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 64)  # 2 samples of 32 bytes a chunk
    monkeypatch.setenv("QPARITY_THREADS", threads)
    prog = _program()
    ex = Executor(prog, timings=True)
    for seed in range(40):  # 8 runs, and more while a starved twin has not frozen yet
        x = _batch(8, seed)
        got = ex.run({"x": x})[0]["y"]
        np.testing.assert_array_equal(got, _whole(prog, x))
        per_sample = np.concatenate([_whole(prog, x[i : i + 1]) for i in range(8)])
        np.testing.assert_array_equal(got, per_sample)
        if seed >= 7 and all(isinstance(t._frozen, Frozen) for t in ex.split.twins):
            break
    workers = int(threads)
    how = "in turn" if workers == 1 else "on 2 threads"
    assert ex.last_path == f"frozen plan, batch split: 4 chunks of 2 {how}"
    assert isinstance(ex._frozen, Frozen) and len(ex.split.twins) == workers - 1
    assert all(isinstance(t._frozen, Frozen) for t in ex.split.twins)
    for seed in range(40, 60):  # the twin may take every chunk of a run before the owner
        if ex.timings:
            break
        ex.run({"x": _batch(8, seed)})
    assert {i for i, _, _ in ex.timings} == {0, 1, 2}  # summed per instruction


def test_a_program_that_mixes_samples_runs_whole(monkeypatch):
    """A Transpose puts every sample into every output row: the first batch's split gives
    other outputs, so that geometry runs whole from then on."""
    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 32)
    prog = _program(mix=True)
    ex = Executor(prog)
    for seed in range(3):
        x = _batch(8, seed)
        np.testing.assert_array_equal(ex.run({"x": x})[0]["y"], _whole(prog, x))
    assert ex.split.verdict == {split.geometry({"x": x}): False}
    assert "batch split" not in ex.last_path


def test_captures_run_the_whole_batch(monkeypatch):
    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 32)
    prog, x = _program(), _batch(4, 0)
    outs, caps = Executor(prog).run({"x": x}, capture=True)
    assert set(caps) == {"quant", "fc", "dq"}
    np.testing.assert_array_equal(outs["y"], _whole(prog, x))


def test_the_owners_timings_sum_the_seconds_each_chunk_left(monkeypatch):
    """The owner's timings, summed when read, add each chunk's seconds as that chunk's run
    left them: the next chunk's run of the same plan does not change the ones kept."""
    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 64)  # 2 samples of 32 bytes a chunk
    monkeypatch.setenv("QPARITY_THREADS", "1")  # the owner runs all 4
    ex = Executor(_program(), timings=True)
    for seed in range(8):
        ex.run({"x": _batch(8, seed)})
    assert isinstance(ex._frozen, Frozen)
    seen, real = [], Executor.kept_timings

    def spy(self):
        kept = real(self)
        seen.append(kept())  # as the chunk left them
        return kept

    monkeypatch.setattr(Executor, "kept_timings", spy)
    ex.run({"x": _batch(8, 99)})
    assert len(seen) == 4
    want: dict[int, float] = {}
    for run in seen:
        for i, _, s in run:
            want[i] = want.get(i, 0.0) + s
    assert {i: s for i, _, s in ex.timings} == pytest.approx(want, rel=1e-12)
