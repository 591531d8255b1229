"""qparity edit (bc_editor): node numbers, fake-quant removal, fallbacks ranked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml

from analysis.edit import pairs_of, parse_numbers, remove_fake_quant
from analysis.edit_run import edit_run
from pipelines.flow import run_chain
from schemas.errors import SpecError
from schemas.spec import parse_spec
from stages.onnx_runner import OnnxRunner
from tests.conftest import tiny_spec_dict


def test_numbers_and_ranges():
    assert parse_numbers("1-3, 7,2", 10) == [1, 2, 3, 7]
    with pytest.raises(SpecError, match="outside the graph's nodes 0-9"):
        parse_numbers("5-12", 10)
    with pytest.raises(SpecError, match="'x' is not a number"):
        parse_numbers("x", 10)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(stages={"stop_after": "convert"}, compare={"enabled": False})
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    model = onnx.load(str(root / result.run_id / "artifacts/export/qat.onnx"))
    return root, result.run_id, model


def test_removing_every_pair_leaves_only_the_table_ops_integer_io(run):
    _, _, model = run
    everything = list(range(len(model.graph.node)))
    edited, removed = remove_fake_quant(model, everything)
    users = {i: n for n in edited.graph.node for i in n.input}
    makers = {o: n for n in edited.graph.node for o in n.output}
    left = [n for n in edited.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert removed and left  # the sigmoid table takes and gives integers
    for n in left:
        near = users.get(n.output[0]) if n.op_type == "QuantizeLinear" else makers[n.input[0]]
        assert near.domain == "qparity", n.name
    x = np.random.default_rng(0).uniform(-1, 1, (4, 1, 8, 8)).astype(np.float32)
    assert OnnxRunner(edited).run(x)[0].shape == OnnxRunner(model).run(x)[0].shape


def test_a_compute_node_stands_for_its_weight_and_output_pairs(run):
    _, _, model = run
    conv = next(i for i, n in enumerate(model.graph.node) if n.op_type == "Conv")
    kinds = sorted(model.graph.node[q].name.split("[")[-1] for q, _ in pairs_of(model, conv))
    assert kinds == ["output]/q", "weight]/q"]


def test_fallbacks_are_ranked_by_consistency_gain(run):
    root, run_id, model = run
    convs = [str(i) for i, n in enumerate(model.graph.node) if n.op_type == "Conv"]
    base, fallbacks = edit_run(root, run_id, ",".join(convs))
    gains = [f.gain for f in fallbacks]
    assert gains == sorted(gains, reverse=True) and len(fallbacks) == len(convs) + 1
    assert all(f.l1 >= 0 and np.isclose(f.gain, base["l1"] - f.l1) for f in fallbacks)
