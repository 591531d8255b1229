"""The primary metric: top1 with labels, cosine without, or the spec's compare.primary."""

from __future__ import annotations

import pytest

from analysis.primary import read_primary
from schemas.errors import SpecError
from schemas.spec import parse_spec
from tests.conftest import tiny_spec_dict


def _rows(metric: str, values: dict, output: str | None = "output") -> list[dict]:
    return [{"stage": s, "metric": metric, "value": v, "output": output} for s, v in values.items()]


def _spec(**compare):
    data = {**tiny_spec_dict()["data"], "metric": "tests.stages.test_evaluate:miou"}
    return parse_spec(tiny_spec_dict(data=data, compare=compare), "t")


COSINE = _rows("cosine", {"calibrate": 0.999, "convert": 0.95})


def test_top1_when_labels_were_recorded_else_cosine():
    spec = parse_spec(tiny_spec_dict(), "t")
    assert read_primary(spec, [*COSINE, *_rows("top1", {"convert": 0.5})]).name == "top1"
    p = read_primary(spec, COSINE)
    assert (p.name, p.limit) == ("cosine", 0.05)  # the tiny spec's top1_drop
    assert p.reason("calibrate", "convert") is None  # 0.049 is within 0.05


def test_the_named_metric_and_its_own_limit_judge_a_pair():
    rows = [*COSINE, *_rows("l1", {"calibrate": 0.01, "convert": 0.2})]
    p = read_primary(_spec(primary="l1", thresholds={"primary_drop": 0.1}), rows)
    assert p.reason("calibrate", "convert") == "l1 rises 0.1900 (> 0.1)"
    p = read_primary(_spec(primary="cosine", thresholds={"primary_drop": 0.01}), rows)
    assert p.reason("calibrate", "convert") == "cosine drops 0.0490 (> 0.01)"
    assert p.reason("calibrate", "board_sim") is None  # not measured: not judged


def test_a_task_metric_can_be_primary_and_a_missing_one_is_named():
    rows = [*COSINE, *_rows("miou", {"calibrate": 0.9, "convert": 0.5}, None)]
    assert read_primary(_spec(primary="miou"), rows).values == {"calibrate": 0.9, "convert": 0.5}
    with pytest.raises(SpecError, match="compare.primary.*'map' is not among"):
        read_primary(_spec(primary="map"), rows)
    with pytest.raises(SpecError, match="'top1' is not among"):
        read_primary(parse_spec(tiny_spec_dict(compare={"primary": "top1"}), "t"), COSINE)


def test_the_judged_output_is_named_else_the_labelled_else_the_class_like_one():
    """Several outputs: the primary metric is read on one, and its reason says which."""
    box = _rows("cosine", {"calibrate": 0.999, "convert": 0.5}, "output.0")
    prob = _rows("cosine", {"calibrate": 0.999, "convert": 0.99}, "output.1")
    agree = _rows("top1_agreement", {"convert": 1.0}, "output.1")
    spec = parse_spec(tiny_spec_dict(), "t")
    assert read_primary(spec, [*box, *prob]).output == "output.0"  # none class-like: first
    p = read_primary(spec, [*box, *prob, *agree])
    assert (p.output, p.values["convert"]) == ("output.1", 0.99)
    labelled = [*box, *prob, *_rows("top1", {"convert": 0.9}, "output.1")]
    assert read_primary(spec, labelled).output == "output.1"
    p = read_primary(_spec(output="output.0"), [*box, *prob, *agree])
    assert p.reason("calibrate", "convert") == "cosine on output.0 drops 0.4990 (> 0.005)"


def test_a_run_is_judged_by_what_its_manifest_records_else_by_its_spec(tmp_path):
    """The manifest's ``judging`` wins (no spec parsed: a spec.yaml that no longer parses
    changes nothing); a run from before the field is judged by its spec.yaml's compare,
    and one whose spec the code refuses by the defaults."""
    import yaml

    from analysis.primary import stored_judging
    from schemas.manifest import Judging
    from schemas.spec_sections import CompareSpec
    from schemas.store import RunStore

    store = RunStore(tmp_path)
    spec = tiny_spec_dict(compare={"primary": "cosine", "thresholds": {"primary_drop": 0.2}})
    text = yaml.safe_dump(spec)
    recorded = Judging(primary="l1", top1_drop=0.01)
    judged = store.create_run("a", text, "ab" * 32, "0", {}, {}, judging=recorded)
    judged.path("spec.yaml").write_text("not: [a spec")
    assert stored_judging(judged) == recorded
    old = store.create_run("b", text, "ab" * 32, "0", {}, {})
    assert stored_judging(old) == parse_spec(spec, "t").compare.as_judging()
    assert stored_judging(old).primary_drop == 0.2
    refused = store.create_run("c", "model: 3", "ab" * 32, "0", {}, {})
    assert stored_judging(refused) == CompareSpec().as_judging()
