"""qat with several outputs (cross-entropy on the judged one) and several integer inputs
(fine-tuned towards the float model's outputs without labels)."""

from __future__ import annotations

from tests.stages.helpers import run_stages

QAT = {"qat": {"enabled": True, "steps": 2, "batch_size": 16}}


def _ctx(make_ctx, factory: str, dataset: str, **compare):
    data = {**make_ctx().spec.data.model_dump(), "dataset": dataset}
    return make_ctx(model={"factory": factory}, data=data, stages=QAT, compare=compare)


def test_fine_tuning_a_dict_of_heads_scores_the_named_one(make_ctx):
    ctx = _ctx(make_ctx, "tests.models:dict_heads", "tests.models:two_head_data",
               output="output.scores.0")  # fmt: skip
    art = run_stages(ctx, "prepare", "calibrate", "qat")["qat"]
    top1 = [m for m in art.metrics if m.metric == "top1"]
    assert [m.output for m in top1] == ["output.scores.0"] and top1[0].value > 0.5  # chance: 0.1
    assert {m.output for m in art.metrics} == {"output.boxes", "output.scores.0"}


def test_fine_tuning_token_inputs_without_labels(make_ctx):
    ctx = _ctx(make_ctx, "tests.models:masked_mean", "tests.models:tokens_data")
    art = run_stages(ctx, "prepare", "calibrate", "qat")["qat"]
    cosine = next(m.value for m in art.metrics if m.metric == "cosine")
    assert cosine > 0.95
