"""stages/ptq/feeds.py: every graph input fed by name, integer inputs refused, output ids,
the judged output; calibration observes every input; each output gets its metrics."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import SpecError, StageError
from schemas.spec_sections import CompareSpec
from schemas.store import RunStore
from stages.data import Split
from stages.onnx_runner import OnnxRunner
from stages.ptq import calibrate_onnx as cal
from stages.ptq import feeds
from stages.ptq.context import PtqContext
from stages.ptq.graph import layer_of, save_model
from stages.ptq.original import assign_layer_ids
from tests.stages.ptq.multi_io_models import embedding, inputs, two_io


def test_a_name_mismatch_names_the_file_and_both_lists():
    split = Split("evaluation", {"mask": np.zeros((2, 4)), "x": np.zeros((2, 1, 8, 8))})
    with pytest.raises(StageError, match=r"\['x', 'm'\] are not the dataset's inputs "
                       r"\['mask', 'x'\]") as e:  # fmt: skip
        feeds.check_inputs(two_io(), split, "model/two_io.onnx")
    assert e.value.where == "model/two_io.onnx"
    feeds.check_inputs(two_io(), Split("evaluation", inputs(2, 0)), "f")  # any order


def test_one_input_is_read_whatever_its_name_several_are_matched_by_name():
    """torchvision's LRASPP names its parameter ``input``, the exporter wrote ``x``."""
    x = np.zeros((2, 3, 8, 8), np.float32)
    got = feeds.align_one_input(Split("evaluation", {"input": x}), ["x"])
    assert list(got.inputs) == ["x"] and got.inputs["x"] is x
    two = Split("evaluation", {"mask": np.zeros((2, 4)), "y": x})
    assert feeds.align_one_input(two, ["x", "m"]) is two  # left to check_inputs' error


def test_an_integer_input_not_read_as_embedding_indices_is_refused_naming_it():
    with pytest.raises(StageError, match="input 'm' is int64 and read by Cast 'cast'") as e:
        feeds.refuse_integer_inputs(two_io(int_input=True), "two_io.onnx")
    assert e.value.where == "two_io.onnx / input m"
    feeds.refuse_integer_inputs(two_io(), "two_io.onnx")
    feeds.refuse_integer_inputs(embedding(), "embedding.onnx")  # token ids: carried


def test_token_ids_get_no_input_quantizer_their_table_a_weight_one():
    model = embedding()
    assign_layer_ids(model)
    names = {n.name: layer_of(n) for n in model.graph.node}
    cal.name_by_layer(model)
    plan = cal.plan(model, cal.QuantConfig(), names)
    assert plan.inputs == {} and plan.tokens == {"emb"}


def test_output_ids_follow_the_onnx_names():
    model = two_io()
    assert feeds.output_ids(model) == ["output.shifted", "output.pooled"]
    model.graph.output[1].name = "/pool/Flatten_output_0"  # not a word: positions instead
    assert feeds.output_ids(model) == ["output.0", "output.1"]
    del model.graph.output[1]
    assert feeds.output_ids(model) == ["output"]


def test_the_judged_output_is_named_or_refused_when_labels_are_ambiguous():
    assert feeds.judged_index(two_io(), "output.pooled", True) == 1
    assert feeds.judged_index(two_io(), None, False) == 0
    with pytest.raises(SpecError, match="could score any of the outputs"):
        feeds.judged_index(two_io(), None, True)


def test_calibration_observes_and_quantizes_every_input():
    model = two_io()
    assign_layer_ids(model)
    names = {n.name: layer_of(n) for n in model.graph.node}
    cal.name_by_layer(model)
    plan = cal.plan(model, cal.QuantConfig(overrides={"input:m": "int16"}), names)
    assert plan.inputs == {"x": "int8", "m": "int16"}
    xs = inputs(8, 0)
    amax = cal.observe(model, [*plan.inputs, *plan.outputs], xs, 3)
    assert amax["m"] == pytest.approx(float(np.abs(xs["m"]).max()))
    assert amax["x"] == pytest.approx(float(np.abs(xs["x"]).max()))
    qdq, _ = cal.insert_qdq(model, plan, amax, cal.QuantConfig())
    quantized = {n.input[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    assert {"x", "m"} <= quantized


def test_every_output_gets_its_metrics_top1_on_the_judged_one(tmp_path):
    run = RunStore(tmp_path).create_run("two_io", "", "d", "c", {}, {})
    ev = Split("evaluation", inputs(6, 1), np.array([0, 1, 2, 3, 0, 1]))
    ctx = PtqContext(run, "two_io", tmp_path / "two_io.onnx", cal.QuantConfig(), None,
                     {"evaluation": ev}, batch_size=4,
                     compare=CompareSpec(output="output.pooled"))  # fmt: skip
    save_model(two_io(), run.path(ctx.file("original")))
    runner = OnnxRunner(two_io())
    rows = ctx.measure("original", lambda f: [o + 1 for o in runner.run(f)])
    by = {(m.output, m.metric): m.value for m in rows}
    assert {o for o, _ in by} == {"output.shifted", "output.pooled"}
    assert ("output.pooled", "top1") in by and ("output.shifted", "top1") not in by
    assert by["output.shifted", "cosine"] < 1.0 and by["output.shifted", "l1"] == pytest.approx(1.0)
