"""bench/zoo.py's specs: a segmentation model is judged by its mIoU in either chain."""

from __future__ import annotations

from bench.zoo import spec_for
from pipelines.ptq import PtqSpec


def test_a_segmentation_ptq_spec_sets_the_miou_task_metric(tmp_path):
    seg = PtqSpec.model_validate(spec_for("lraspp_mobilenet_v3_large", True, 16, True, tmp_path))
    assert seg.data.metric == "examples.zoo.data:miou"
    assert spec_for("resnet18", True, 16, True, tmp_path)["data"].get("metric") is None
    qat = spec_for("fcn_resnet50", True, 16, False, tmp_path)
    assert qat["data"]["metric"] == "examples.zoo.data:miou"
