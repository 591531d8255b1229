"""The text example (int64 token ids and attention mask) through all seven stages at a
reduced sample count."""

from __future__ import annotations

import yaml

from pipelines.flow import run_chain
from schemas.spec import load_spec, parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table
from simulator.program import hbm

SEVEN = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]


def test_token_inputs_run_all_seven_stages(tmp_path):
    spec = load_spec("examples/text/spec.yaml").model_dump(mode="json", exclude_none=True)
    spec["data"].update(dataset="examples.text.data:load_few", batch_size=32,
                        calibration_samples=32, evaluation_samples=32)  # fmt: skip
    spec["compare"]["enabled"] = False
    result = run_chain(parse_spec(spec, "t"), yaml.safe_dump(spec), tmp_path, use_prefect=False)
    run = RunStore(tmp_path).open(result.run_id)
    rows = read_run_table(run, "metrics")
    cosine = {r["stage"]: r["value"] for r in rows if r["metric"] == "cosine"}
    assert min(cosine[s] for s in SEVEN) > 0.999
    program = hbm.load(run.path("artifacts/compile/model.hbm"))
    assert [v["dtype"] for v in program.inputs.values()] == ["int64", "int64"]
