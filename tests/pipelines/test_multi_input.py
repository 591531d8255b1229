"""A text-encoder-shaped model with two int64 inputs (token ids into an embedding, an
attention mask pooling them) through all seven stages: the inputs stay int64 in qat.onnx
and on the board, no quantizer sits on an integer value, the embedding runs as a Gather
instruction of the program, and every stage agrees with the float model."""

from __future__ import annotations

import onnx
import pytest
import yaml

from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
from simulator.program import hbm
from simulator.program.isa import Op
from tests.conftest import tiny_spec_dict

SEVEN = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(
        model={"factory": "tests.models:masked_mean"},
        data={**tiny_spec_dict()["data"], "dataset": "tests.models:tokens_data"},
        compare={**tiny_spec_dict()["compare"], "enabled": False},
    )
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return RunStore(root).open(result.run_id)


def test_every_stage_agrees_with_the_float_model(tokens):
    assert tokens.manifest().status == "complete"
    cosine = {r["stage"]: r["value"] for r in read_run_table(tokens, "metrics")
              if r["metric"] == "cosine"}  # fmt: skip
    assert set(SEVEN) <= set(cosine)
    assert min(cosine[s] for s in SEVEN) > 0.99
    assert cosine["board_sim"] == cosine["convert"]  # bit-exact from convert on


def test_integer_inputs_stay_integers_and_the_embedding_is_an_instruction(tokens):
    graph = onnx.load(str(tokens.path("artifacts/export/qat.onnx"))).graph
    int64 = onnx.TensorProto.INT64
    assert [i.type.tensor_type.elem_type for i in graph.input] == [int64, int64]
    assert not [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] in
                {i.name for i in graph.input}]  # fmt: skip
    program = hbm.load(tokens.path("artifacts/compile/model.hbm"))
    assert [v["dtype"] for v in program.inputs.values()] == ["int64", "int64"]
    (gather,) = [i for i in program.instructions if i.attrs.get("op_type") == "Gather"]
    assert gather.op is Op.LAYOUT and gather.attrs["table"] == 1


def test_the_attention_mask_path_runs_as_the_pre_export_error_advises(tmp_path):
    """(1 - mask) * -1e4 added to the scores before a softmax: with the int16 override
    pre_export names (tests/stages/test_table_ops.py), all seven stages agree with float;
    the one-output score Linear converts (its per-channel scale has one entry)."""
    data = tiny_spec_dict(
        model={"factory": "tests.models:tokens"},
        data={**tiny_spec_dict()["data"], "dataset": "tests.models:tokens_data"},
        quant={"overrides": {"add_1": "int16", "softmax": "int16"}},
        compare={**tiny_spec_dict()["compare"], "enabled": False},
    )
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), tmp_path, use_prefect=False)
    rows = read_run_table(RunStore(tmp_path).open(result.run_id), "metrics")
    cosine = {r["stage"]: r["value"] for r in rows if r["metric"] == "cosine"}
    assert set(SEVEN) <= set(cosine) and min(cosine[s] for s in SEVEN) > 0.99
