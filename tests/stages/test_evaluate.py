"""Stage metrics: agreement with the float model per output, top1 only with labels, and a
task metric plugged in with data.metric."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from schemas.errors import SpecError, StageError
from stages.data import Split
from stages.evaluate import agreement, collect, measure, stage_metrics

REF = np.array([[2.0, 0.0, 1.0], [0.0, 3.0, 1.0]])
OUT = np.array([[2.0, 0.5, 1.0], [1.0, 0.0, 1.0]])  # sample 1 changes its arg-max


def miou(out, ref, labels) -> dict:
    """A task metric for the tests: share of arg-max equal to the float model's, named."""
    return {"miou": float((out.argmax(1) == ref.argmax(1)).mean()), "seen": float(len(out))}


def test_agreement_against_a_slow_obvious_reference():
    got = agreement(OUT, REF)
    f, s = REF.ravel(), OUT.ravel()
    assert got["cosine"] == pytest.approx(f @ s / np.linalg.norm(f) / np.linalg.norm(s))
    assert got["sqnr_db"] == pytest.approx(10 * np.log10((f**2).sum() / ((s - f) ** 2).sum()))
    assert got["l1"] == pytest.approx(np.abs(s - f).mean())
    assert got["top1_agreement"] == 0.5
    same = agreement(REF, REF)
    assert (same["cosine"], same["sqnr_db"], same["l1"]) == (1.0, 300.0, 0.0)


def test_a_map_output_has_no_top1_agreement():
    maps = np.ones((2, 4, 3, 3))
    assert set(agreement(maps, maps)) == {"cosine", "sqnr_db", "l1"}


def test_top1_is_recorded_only_with_labels_and_every_row_names_its_output():
    unlabelled = measure("convert", {"output": OUT}, {"output": REF}, None)
    assert {m.metric for m in unlabelled} == {"cosine", "sqnr_db", "l1", "top1_agreement"}
    assert {m.output for m in unlabelled} == {"output"} and unlabelled[0].n_samples == 2
    labelled = measure("convert", {"output": OUT}, {"output": REF}, np.array([0, 0]))
    assert {m.metric: m.value for m in labelled}["top1"] == 1.0


def test_a_task_metric_joins_the_metrics_without_an_output():
    rows = measure("convert", {"output": OUT}, {"output": REF}, None, miou)
    task = {m.metric: (m.value, m.output) for m in rows if m.output is None}
    assert task == {"miou": (0.5, None), "seen": (2.0, None)}


@pytest.mark.parametrize(
    ("task", "says"),
    [(lambda o, r, y: 1 / 0, "raised ZeroDivisionError"),
     (lambda o, r, y: {"miou": "high"}, "returned {'miou': 'high'}"),
     (lambda o, r, y: {"miou": float("nan")}, "returned"),
     (lambda o, r, y: {}, "returned {}")],
)  # fmt: skip
def test_a_broken_task_metric_is_named(task, says):
    with pytest.raises(StageError, match="data.metric") as e:
        measure("convert", {"output": OUT}, {"output": REF}, None, task)
    assert says in e.value.message


def test_top1_scores_only_the_judged_output():
    heads = {"output.0": OUT, "output.1": REF}  # two (N, C) outputs
    rows = measure("convert", heads, heads, np.array([0, 1]), judged="output.1")
    top1 = {(m.output, m.value) for m in rows if m.metric == "top1"}
    assert top1 == {("output.1", 1.0)}
    assert {m.output for m in rows if m.metric == "cosine"} == {"output.0", "output.1"}
    with pytest.raises(SpecError, match="compare.output"):  # labels fit both: name one
        measure("convert", heads, heads, np.array([0, 1]))


def test_collect_keys_outputs_by_id_over_every_batch():
    split = Split("evaluation", {"x": np.arange(10, dtype=np.float32).reshape(5, 2)})
    got = collect(lambda x: x * 2, split, 2, "t")
    assert list(got) == ["output"] and np.array_equal(got["output"], split.x * 2)
    got = collect(lambda x: (x * 2, {"boxes": x}), split, 2, "t")  # every output, by path
    assert list(got) == ["output.0", "output.1.boxes"]
    assert np.array_equal(got["output.1.boxes"], split.x)


class _ConvHead(torch.nn.Module):
    """A conv, then a head that flattens with ``view`` (or ``flatten``)."""

    def __init__(self, view: bool):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.fc, self.view = torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(8 * 36, 4), view

    def forward(self, x):
        y = self.conv(x)
        self.seen = y.is_contiguous(memory_format=torch.channels_last)
        return self.fc(y.view(len(y), -1) if self.view else torch.flatten(y, 1))


@pytest.mark.parametrize("view", [False, True])
def test_the_float_model_runs_channels_last_unless_it_rejects_it(view):
    """nhwc: the same outputs up to float rounding, in channels-last memory; a model whose
    ``view`` cannot take that memory runs every batch on NCHW input instead."""
    x = np.random.default_rng(0).standard_normal((5, 3, 8, 8), dtype=np.float32)
    split, model = Split("evaluation", {"x": x}), _ConvHead(view)
    want = collect(model, split, 2, "t")["output"]
    assert not model.seen
    got = collect(model, split, 2, "t", nhwc=True)["output"]
    assert model.seen is not view  # the last batch's layout
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_stage_metrics_refuse_a_primary_the_stage_does_not_record(make_ctx):
    ctx = make_ctx(
        data={**make_ctx().spec.data.model_dump(), "dataset": "tests.models:unlabelled_data"},
        compare={"primary": "top1"},
    )
    with pytest.raises(SpecError, match="compare.primary.*'top1' is not among"):
        stage_metrics(ctx, "prepare", lambda x: ctx.float_model(x))
    ctx = make_ctx()
    rows = stage_metrics(ctx, "prepare", lambda x: torch.zeros(len(x), 10))
    assert {m.metric: m.value for m in rows}["top1_agreement"] < 0.5


def test_non_finite_outputs_give_finite_metrics_that_an_artifact_can_hold():
    broken = OUT.copy()
    broken[0, 0] = np.nan
    rows = measure("convert", {"output": broken}, {"output": REF}, None)
    assert all(np.isfinite(m.value) for m in rows)
    assert {m.metric: m.value for m in rows}["l1"] == pytest.approx((2 + 0.5 + 1 + 3) / 6)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_torch_model_runs_on_the_free_cores_and_gets_its_threads_back(threads, monkeypatch):
    """QPARITY_THREADS stands in for the cores other processes leave free."""
    monkeypatch.setenv("QPARITY_THREADS", threads)
    restore = torch.get_num_threads()
    torch.set_num_threads(2)  # the CI's workers run one torch thread each
    seen, before = [], torch.get_num_threads()

    def model(x):
        seen.append(torch.get_num_threads())
        return x

    split = Split("evaluation", {"x": np.zeros((5, 2), np.float32)})
    collect(model, split, 2, "t")
    after = torch.get_num_threads()
    torch.set_num_threads(restore)
    assert seen == [int(threads)] * 3 and after == before == 2
