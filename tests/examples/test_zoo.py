"""The zoo: the libraries' own models through every stage (a few, at reduced size), its
specs and sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from examples.zoo import images, make_specs
from examples.zoo.models import ZOO, entry_of
from pipelines.flow import run_chain
from pipelines.sweep import expand, load_sweep
from schemas.spec import parse_spec
from schemas.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["prepare", "calibrate", "pre_export", "export", "convert", "compile", "board_sim"]


def test_the_zoo_has_30_architectures_from_both_libraries():
    assert len(ZOO) >= 30
    assert {e.library for e in ZOO.values()} == {"torchvision", "timm"}


def test_specs_on_disk_are_what_make_specs_writes():
    for name in ZOO:
        path = ROOT / "examples/zoo/specs" / f"{name}.yaml"
        assert path.read_text() == make_specs.spec_text(name), f"rerun make_specs for {name}"


def test_the_zoo_sweep_runs_every_model_once():
    runs = expand(load_sweep(ROOT / "pipelines/sweeps/zoo.yaml"))
    factories = sorted(spec.model.factory for _, spec in runs)
    assert factories == sorted(f"examples.zoo.models:{n}" for n in ZOO)


def test_crops_are_seeded_normalized_images():
    a, b = images.crops(3, 32, seed=5), images.crops(3, 32, seed=5)
    assert a.shape == (3, 3, 32, 32) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert -2.2 < a.min() < 0 < a.max() < 2.7  # ImageNet-normalized pixels
    assert not np.array_equal(a, images.crops(3, 32, seed=6))


def test_unknown_zoo_names_say_what_the_zoo_has():
    with pytest.raises(AttributeError, match="resnet18"):
        entry_of("resnet9000")


@pytest.mark.parametrize(
    "name, factory",
    [("mobilenet_v3_small", "examples.zoo.models:small_mobilenet_v3_small"),
     ("swin_t", "tests.models:shallow_swin_t")],
)  # fmt: skip
def test_a_zoo_model_as_its_library_ships_it_runs_every_stage(name, factory, tmp_path, monkeypatch):
    """In-place ops, hardswish/hardsigmoid SE gates, dropout (mobilenet_v3); windowed
    attention with an in-place-built mask and relative position bias (torchvision's
    SwinTransformer, swin_t's configuration at fewer blocks per stage): every stage
    completes and compile proves itself bit-exact against quantized.onnx."""
    monkeypatch.setenv("QPARITY_ZOO_FRAMES", "8")
    spec = yaml.safe_load((ROOT / "examples/zoo/spec.yaml").read_text())
    spec["model"]["factory"] = factory
    spec["data"].update(
        dataset=f"examples.zoo.data:small_{name}",
        calibration_samples=8,
        evaluation_samples=8,
        batch_size=8,
    )
    spec["compare"] = {"enabled": False}
    result = run_chain(parse_spec(spec, "zoo"), yaml.safe_dump(spec), tmp_path, use_prefect=False)
    manifest = RunStore(tmp_path).open(result.run_id).manifest()
    assert [s for s in STAGES if manifest.stages[s].status == "complete"] == STAGES


def test_the_onnx_export_keeps_module_scopes_and_a_dynamic_batch(tmp_path):
    """examples.zoo.onnx_export: the PTQ chain's input, as torch's TorchScript exporter
    writes a library model."""
    import onnx

    from examples.zoo import onnx_export

    path = onnx_export.small_squeezenet1_1(tmp_path / "sq.onnx")
    model = onnx.load(path)
    onnx.checker.check_model(model)
    (x,) = model.graph.input
    assert x.name == "x" and x.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert any(n.name.startswith("/features/features.0/") for n in model.graph.node)
    with pytest.raises(AttributeError, match="resnet18"):
        onnx_export.small_resnet9000  # noqa: B018


def test_segmentation_models_are_judged_by_miou_against_the_float_map():
    from examples.zoo.data import miou

    ref = np.zeros((1, 3, 2, 2))
    ref[0, 1, 0, :] = 1  # class 1 on the top row, class 0 below
    same = miou({"output.out": ref}, {"output.out": ref}, None)
    assert same == {"miou": 1.0}
    moved = ref.copy()
    moved[0, 1, 1, 0] = 2  # one more pixel of class 1
    assert miou(moved, ref, None)["miou"] == pytest.approx((2 / 3 + 1 / 2) / 2)  # classes 1, 0
    spec = yaml.safe_load(make_specs.spec_text("lraspp_mobilenet_v3_large"))
    assert spec["data"]["metric"] == "examples.zoo.data:miou"


def test_the_dynamo_export_falls_back_to_a_fixed_batch_when_torch_export_refuses(
    tmp_path, monkeypatch
):
    """convnext: torch.export refuses the dynamic batch of the batch-1 example; the file
    is then written with the batch fixed, which the PTQ chain's original makes dynamic."""
    import torch

    from examples.zoo import onnx_export

    calls = []

    def export(model, example, path, dynamic=True):
        calls.append(dynamic)
        if dynamic:
            raise torch.onnx.OnnxExporterError("Invalid ranges [2:1]")
        return path

    monkeypatch.setattr(onnx_export, "dynamo_export", export)
    assert onnx_export.dynamo_small_squeezenet1_1(tmp_path / "sq.onnx") == tmp_path / "sq.onnx"
    assert calls == [True, False]


def test_calibration_crops_follow_qparity_zoo_calibration(monkeypatch):
    """bench/simulator.py calibrates on 8 crops: labelling 256 at 224x224 was most of its
    chain's time."""
    from examples.zoo import data

    monkeypatch.delenv("QPARITY_ZOO_CALIBRATION", raising=False)
    assert data.calibration_frames() == data.CALIBRATION == 256
    monkeypatch.setenv("QPARITY_ZOO_CALIBRATION", "8")
    assert data.calibration_frames() == 8


def test_labels_are_kept_for_the_next_process_and_read_back_equal(tmp_path, monkeypatch):
    """The float model labels the crops once; a later process (the in-process cache
    emptied) reads them from the cache folder without building the model, a corrupt file
    is labelled again, and a changed key (other code or libraries) is a new file."""
    from examples.zoo import data

    monkeypatch.setattr(data, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(data, "_LABELS", {})
    built, build = [], data.build
    monkeypatch.setattr(data, "build", lambda *a: built.append(a) or build(*a))
    train, ev = images.crops(4, 32, seed=1), images.crops(6, 32, seed=2)
    first = data._labelled("mobilenet_v3_small", 32, train, ev)
    assert len(built) == 1 and [len(a) for a in first] == [4, 6]
    (path,) = tmp_path.iterdir()
    data._LABELS.clear()
    again = data._labelled("mobilenet_v3_small", 32, train, ev)
    assert len(built) == 1 and _same(first, again)
    path.write_bytes(b"not an npz")
    data._LABELS.clear()
    mended = data._labelled("mobilenet_v3_small", 32, train, ev)
    assert len(built) == 2 and _same(first, mended)
    monkeypatch.setattr(data, "labels_key", lambda: "another")
    data._LABELS.clear()
    data._labelled("mobilenet_v3_small", 32, train, ev)
    assert len(built) == 3 and len(list(tmp_path.iterdir())) == 2


def _same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
