"""The PTQ chain's inputs and outputs (stages/ptq/feeds.py): a dataset not named like the
graph's inputs, an integer input, a judged output the graph lacks."""

from __future__ import annotations

import numpy as np

from schemas.errors import SpecError, StageError


def _renamed(env):
    from stages.data import Split
    from stages.ptq import feeds
    from tests.stages.ptq.multi_io_models import two_io

    split = Split("evaluation", {"x": np.zeros((2, 1, 8, 8)), "mask": np.zeros((2, 4))})
    feeds.check_inputs(two_io(), split, "two_io.onnx")


def _int64_ids(env):
    from stages.ptq import feeds
    from tests.stages.ptq.multi_io_models import two_io

    feeds.refuse_integer_inputs(two_io(int_input=True), "two_io.onnx")


def _no_such_output(env):
    from stages.ptq import feeds
    from tests.stages.ptq.multi_io_models import two_io

    feeds.judged_index(two_io(), "output.boxes", False)


def cases() -> dict:
    return {
        "ptq dataset inputs not the graph's": (_renamed, StageError, "['x', 'm']"),
        "ptq int64 graph input": (_int64_ids, StageError, "input 'm' is int64"),
        "ptq compare.output not a graph output": (_no_such_output, SpecError, "output.boxes"),
    }
