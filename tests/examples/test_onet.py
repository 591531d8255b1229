"""The ONet example (three heads: boxes, landmarks, face probability) through all seven
stages at a reduced sample count: every head is measured at every stage."""

from __future__ import annotations

import yaml

from examples.onet import model
from pipelines.flow import run_chain
from schemas.spec import load_spec, parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table

SEVEN = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]


def test_three_heads_in_mtcnn_order():
    boxes, landmarks, face = model.build()(model.torch.zeros(2, 3, 48, 48))
    assert (boxes.shape, landmarks.shape, face.shape) == ((2, 4), (2, 10), (2, 2))
    assert model.torch.allclose(face.sum(1), model.torch.ones(2))


def test_every_head_is_measured_through_all_seven_stages(tmp_path):
    spec = load_spec("examples/onet/spec.yaml").model_dump(mode="json", exclude_none=True)
    spec["data"].update(dataset="examples.onet.data:load_few", batch_size=16,
                        calibration_samples=16, evaluation_samples=16)  # fmt: skip
    spec["compare"]["enabled"] = False
    result = run_chain(parse_spec(spec, "t"), yaml.safe_dump(spec), tmp_path, use_prefect=False)
    rows = read_run_table(RunStore(tmp_path).open(result.run_id), "metrics")
    cosine = {(r["stage"], r["output"]): r["value"] for r in rows if r["metric"] == "cosine"}
    for stage in ["float", *SEVEN]:
        for head in ("output.0", "output.1", "output.2"):
            assert cosine[(stage, head)] > 0.999, (stage, head)
    assert not [r for r in rows if r["metric"] == "top1"]  # no labels: none invented
