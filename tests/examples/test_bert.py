"""The BERT example, reduced (2 layers, hidden 256, to calibrate): in all-int8 the advisor names the
residual adds and the mask add, and the int16 overrides it recommends restore agreement."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table

SPEC = Path(__file__).resolve().parents[2] / "examples" / "bert" / "spec.yaml"
SMALL = {"layers": 2, "hidden": 256, "heads": 4, "intermediate": 256, "outlier_scale": 12.0}
"""Two layers build up less of the stream's outliers than six: larger outlier weights."""


def _run(root, overrides: dict, compare: bool = True) -> tuple[float, str | None]:
    """(calibrate's output cosine, the advisor file: None without compare) of a run to
    calibrate."""
    spec = yaml.safe_load(SPEC.read_text())
    spec["model"]["kwargs"] = SMALL
    spec["data"] |= {"dataset": "examples.bert.data:small", "calibration_samples": 16,
                     "evaluation_samples": 8, "batch_size": 8}  # fmt: skip
    spec["quant"]["overrides"] = overrides
    spec["stages"]["stop_after"] = "calibrate"
    spec["compare"] = {"enabled": compare}
    result = run_chain(parse_spec(spec, "bert"), yaml.safe_dump(spec), root, use_prefect=False)
    run = RunStore(root).open(result.run_id)
    rows = read_run_table(run, "metrics")
    cosine = next(r["value"] for r in rows if r["stage"] == "calibrate" and r["metric"] == "cosine")
    advisor = run.path("debug/abnormal_layer_advisor.txt")
    return cosine, advisor.read_text() if compare else None


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_advisor_names_the_residual_adds_and_mask_add_and_its_overrides_restore(tmp_path):
    before, advisor = _run(tmp_path, {})
    assert "| residual add (stream from " in advisor and "| mask add: " in advisor, advisor
    recommended = re.findall(r"^#     (\S+): int16$", advisor, re.M)
    assert recommended, advisor
    after, _ = _run(tmp_path, dict.fromkeys(recommended, "int16"), compare=False)
    assert before < 0.95 and after > before + 0.1, (before, after, recommended)


def test_the_bundled_vocabulary_is_the_grammars_and_splits_word_pieces():
    from examples.bert import data

    assert data.VOCAB.read_text().split() == data.vocab_lines()
    tokens = data.tokenizer().tokenize("Their sensors watched a dog.")
    assert tokens == ["their", "sensor", "##s", "watch", "##ed", "a", "dog", "."]
    split = data.split(8, 0)["inputs"]
    assert split["input_ids"].dtype == split["attention_mask"].dtype == np.int64
    assert (split["input_ids"][split["attention_mask"] == 0] == 0).all()  # [PAD] is id 0
