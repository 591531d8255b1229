"""Table ops added through the op table run the whole chain: elu (one ``lut`` entry in
stages/ops/activations.py, no kernel of its own) becomes one LUT instruction, bit-exact."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from simulator.program import hbm
from simulator.program.isa import Op
from simulator.runtime.executor import Executor
from stages import ops
from stages.convert.stage import run_integer
from tests.models import _labelled_by
from tests.stages.helpers import run_stages

CHAIN = ("prepare", "calibrate", "pre_export", "export", "convert", "compile")


class EluNet(nn.Module):
    """conv -> ELU -> linear head: the ELU's input and output are quantized, so it is a table."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.act = nn.ELU(alpha=0.7)
        self.head = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.head(self.act(self.conv(x)).flatten(1))


def elu_net() -> nn.Module:
    torch.manual_seed(0)
    return EluNet().eval()


def elu_data() -> dict:
    return _labelled_by(elu_net())


def test_elu_is_one_lut_entry():
    e = ops.BY_NAME["elu"]
    assert (e.category, e.table_op, e.instructions) == (ops.Category.LUT, "Lut", (Op.LUT,))
    assert e.targets == (torch.ops.aten.elu.default,)


def test_elu_runs_prepare_to_compile_as_one_bit_exact_lut(make_ctx):
    here = "tests.stages.ops.test_activations"
    data = {"dataset": f"{here}:elu_data", "calibration_samples": 64,
            "evaluation_samples": 64, "batch_size": 32}  # fmt: skip
    ctx = make_ctx(model={"factory": f"{here}:elu_net"}, data=data)
    arts = run_stages(ctx, *CHAIN)
    assert arts["convert"].float_ops == []  # the ELU has its integer (table) form
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    assert [i.op for i in program.instructions if "act" in i.layer_ids] == [Op.LUT]
    x = ctx.evaluation.x
    _, got = Executor(program).run({"x": x}, capture=True)
    _, ref = run_integer(ctx.run.root, arts["convert"], x)
    assert np.array_equal(got["act"], ref["act"][0])
    assert len(np.unique(ref["act"][0])) > 20  # the table maps many inputs, not a constant
