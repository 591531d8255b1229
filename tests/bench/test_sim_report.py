"""bench/sim_report.py's time split by instruction kind."""

from __future__ import annotations

import numpy as np

from bench.sim_report import by_kind, instruction_kind, print_splits
from simulator.program.isa import Instruction, Op, Program


def _program() -> Program:
    """A depthwise conv (plain layout, ONNX weights), a 1x1 conv with a fused add and a 3x3
    conv (nhwc weights ``[O, kh, kw, C]``), a layout move and a clip."""
    consts = {"dw": np.zeros((8, 1, 3, 3), np.int8), "pw": np.zeros((16, 1, 1, 8), np.int8),
              "k3": np.zeros((16, 3, 3, 8), np.int8)}  # fmt: skip
    nhwc = {"layout": "nhwc"}
    instrs = [
        Instruction(Op.CONV, ("x",), ("a",), ("dw",), {"group": 8}),
        Instruction(Op.LAYOUT, ("a",), ("b",), (), {"op_type": "ToNHWC"}),
        Instruction(Op.CONV, ("b", "r"), ("c",), ("pw",), nhwc),
        Instruction(Op.CONV, ("c",), ("d",), ("k3",), nhwc),
        Instruction(Op.CLIP, ("d",), ("y",), (), {"lo": 0, "hi": 6}),
    ]
    return Program("nash-e", {"x": {}, "r": {}}, {"y": {}}, instrs, consts, {})


def test_instruction_kinds_tell_depthwise_pointwise_and_fused_adds_apart():
    prog = _program()
    kinds = [instruction_kind(ins, prog) for ins in prog.instructions]
    assert kinds == ["conv depthwise", "layout ToNHWC", "conv 1x1 + add", "conv 3x3", "clip"]


def test_by_kind_sums_the_seconds_of_each_kind():
    prog = _program()
    split = by_kind({0: 0.5, 1: 0.25, 2: 1.0, 4: 0.125}, prog)
    assert split == {"conv depthwise": 0.5, "layout ToNHWC": 0.25, "conv 1x1 + add": 1.0,
                     "clip": 0.125}  # fmt: skip


def test_a_split_batch_says_its_seconds_are_the_calling_threads_share(capsys):
    """Under a batch split the instructions' seconds cover only the calling thread's chunks:
    the report says so rather than calling the rest overhead."""
    prog = _program()
    split = {"ops": {"conv": 0.002}, "instrs": {0: 0.001, 2: 0.001}, "rounds": 5}
    for path, said in (("frozen plan", False),
                       ("frozen plan, batch split: 4 chunks of 2 on 2 threads", True)):  # fmt: skip
        print_splits({("m", 8): ({**split, "path": path}, prog, 0.004, None)})
        assert ("the chunks the calling thread ran" in capsys.readouterr().out) == said
