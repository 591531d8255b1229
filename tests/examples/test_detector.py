"""The detector example: torchvision's SSDlite returning twelve raw maps, each carried as an
output through all seven stages (reduced: 96 x 96, 4 frames), and the mAP@0.5 metric it is
scored by, against a direct check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from examples.detector import metric, model
from examples.zoo.images import crops
from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from schemas.tables import read_run_table

SPEC = Path(__file__).resolve().parents[2] / "examples" / "detector" / "spec.yaml"
IDS = [f"output.{k}.{i}" for k in ("scores", "boxes") for i in range(6)]


def _outputs(m, x) -> dict:
    with torch.no_grad():
        out = m(torch.from_numpy(x))
    return {f"output.{k}.{i}": t.numpy() for k, maps in out.items() for i, t in enumerate(maps)}


@pytest.fixture(scope="module")
def reference():
    m = model.build()
    return _outputs(m, crops(2, model.SIZE, 5))


def test_map50_is_one_on_the_float_detections_and_falls_as_the_maps_move(reference):
    rng = np.random.default_rng(0)

    def noisy(s: float) -> dict:
        return {k: v + s * v.std() * rng.standard_normal(v.shape).astype(np.float32)
                for k, v in reference.items()}  # fmt: skip

    scores = [metric.map50(noisy(s), reference, None)["map50"] for s in (0.0, 0.1, 1.0)]
    assert scores[0] == 1.0 and scores[0] > scores[1] > scores[2], scores


def test_the_best_detection_is_its_anchor_moved_by_torchvisions_box_coder(reference):
    """Image 0's first detection: the best (anchor, class) score of the softmax over the
    twelve maps in the head's layout, its box torchvision's decoding of that anchor."""
    _, box, cls, score = metric.detections(reference)[0]
    logits = metric._flat(reference, "scores", model.CLASSES)[0]
    probs = torch.softmax(torch.from_numpy(logits), -1).numpy()[:, 1:]
    anchor, best = np.unravel_index(probs.argmax(), probs.shape)
    deltas = torch.from_numpy(metric._flat(reference, "boxes", 4)[0][anchor : anchor + 1])
    want = model.ssdlite().box_coder.decode_single(deltas, metric.anchors()[anchor : anchor + 1])
    assert (cls, score) == (best + 1, pytest.approx(probs.max()))
    assert np.allclose(box, want.numpy()[0])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_every_raw_map_is_an_output_through_all_seven_stages(tmp_path):
    spec = yaml.safe_load(SPEC.read_text())
    spec["model"]["kwargs"] = {"size": 96}
    spec["data"] |= {"dataset": "examples.detector.data:few", "calibration_samples": 4,
                     "evaluation_samples": 4, "batch_size": 4}  # fmt: skip
    spec["data"].pop("metric")  # the anchors are the 320 x 320 model's
    spec["compare"] = {"enabled": False, "output": "output.scores.0"}
    result = run_chain(parse_spec(spec, "detector"), yaml.safe_dump(spec), tmp_path,
                       use_prefect=False)  # fmt: skip
    rows = read_run_table(RunStore(tmp_path).open(result.run_id), "metrics")
    board = {r["output"] for r in rows if r["stage"] == "board_sim" and r["metric"] == "cosine"}
    assert board == set(IDS)
