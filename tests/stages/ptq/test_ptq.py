"""ptq: the table ops exporters write become bit-exact lookup tables, Softmax the
composite of two (stages/ptq/ptq.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

from pipelines.ptq import run_ptq
from schemas.store import RunStore
from simulator.program.march import MARCHES
from stages.ptq.ptq import TABLE_FNS, _payload
from tests.stages.ptq.conftest import helper_model, spec

ATTRS = {"HardSigmoid": {"alpha": 1 / 6, "beta": 0.5}, "LeakyRelu": {"alpha": 0.1}, "Elu": {}}


@pytest.mark.parametrize(
    "op", ["HardSigmoid", "HardSwish", "Erf", "LeakyRelu", "Elu", "Softplus", "Softmax"]
)
def test_a_table_op_runs_every_stage_as_one_lookup_table(op, tmp_path):
    model = helper_model(op)
    for k, v in ATTRS.get(op, {}).items():
        model.graph.node[-1].attribute.append(helper.make_attribute(k, v))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    run = RunStore(tmp_path / "runs").open(run_ptq(path, spec(), tmp_path / "runs"))
    assert run.manifest().status == "complete"  # hbm proved bit-exact against quantized
    ptq = onnx.load(run.path("artifacts/ptq/m_ptq_model.onnx"))
    fixed = "Softmax" if op == "Softmax" else "Lut"
    got = [n.name for n in ptq.graph.node if n.op_type == fixed and n.domain == "qparity"]
    assert got == [f"my_{op.lower()}"]
    assert not any(n.op_type == op and not n.domain for n in ptq.graph.node)


def test_table_functions_follow_the_onnx_definitions():
    x = torch.linspace(-6, 6, 97)
    node = helper.make_node("HardSigmoid", ["x"], ["y"], alpha=1 / 6, beta=0.5)
    torch.testing.assert_close(
        TABLE_FNS["HardSigmoid"](node)(x), torch.nn.functional.hardsigmoid(x)
    )
    default = TABLE_FNS["HardSigmoid"](helper.make_node("HardSigmoid", ["x"], ["y"]))
    torch.testing.assert_close(default(x), torch.clamp(0.2 * x + 0.5, 0, 1))
    gelu = TABLE_FNS["Gelu"](helper.make_node("Gelu", ["x"], ["y"], approximate="tanh"))
    torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))
    leaky = TABLE_FNS["LeakyRelu"](helper.make_node("LeakyRelu", ["x"], ["y"]))
    assert np.isclose(float(leaky(torch.tensor(-1.0))), -0.01)


def test_a_softmax_on_a_grid_too_coarse_for_its_exp_table_stays_float_with_the_reason():
    """BERT's additive mask (-10000) makes the int8 scale of the scores ~78: the exp table
    has no integers to sample (it raised a SimulatorError naming no layer)."""
    node = helper.make_node("Softmax", ["s"], ["p"], name="attn", axis=-1)
    payload, why = _payload(node, (78.4, "int8"), (1 / 255, "int8"), MARCHES["nash-e"],
                            {"s": [1, 2, 16, 16]})  # fmt: skip
    assert payload is None
    assert why.startswith("input grid int8 scale 78.4 too coarse for the exp table")
    assert "int16 (quant.overrides)" in why
