"""Hostile inputs of issue #22 for the catalog (tests/catalog/test_bad_inputs.py): spec
fields out of range in every section, bad sweep files and schedules, broken model factories
and datasets, corrupted run files, hostile SQL and run ids, malformed ``--set``.

Every case is cheap: no chain runs. Files are corrupted in scratch copies (or in a scratch
copy of the whole run); the complete run of the catalog is never changed.
"""

from __future__ import annotations

import io
import json

import yaml

from schemas.errors import ArtifactError, QueryError, SimulatorError, SpecError, StageError
from schemas.spec import parse_spec, with_overrides
from schemas.store import RunStore
from stages.data import load_splits
from tests.catalog.cases_cli import _sql
from tests.catalog.cases_files import _copied_run
from tests.conftest import tiny_spec_dict
from tests.models import data as tiny_data

HERE = "tests.catalog.cases_hostile"


def _spec(**sections):
    return parse_spec(tiny_spec_dict(**sections), "s.yaml")


def _data(**fields):
    return _spec(data={**tiny_spec_dict()["data"], **fields})


def _stages(**fields):
    return _spec(stages=fields)


def _unknown_override(env):
    import torch

    from stages.context import policy_from_spec
    from stages.modelio import prepare_qat
    from tests.models import tiny

    spec = _spec(quant={"overrides": {"nohead": "int16"}})
    return prepare_qat(tiny(), torch.zeros(2, 1, 8, 8), policy_from_spec(spec))


def spec_cases() -> dict:
    return {
        "unknown march": (lambda e: _spec(quant={"march": "nash-x"}), SpecError, "quant.march"),
        "override dtype not a dtype": (lambda e: _spec(quant={"overrides": {"head": "int4"}}),
                                       SpecError, "quant.overrides.head"),
        "override naming no layer": (_unknown_override, SpecError, "nohead"),
        "multiplier bits 0": (lambda e: _stages(convert={"multiplier_bits": 0}), SpecError,
                              "stages.convert.multiplier_bits"),
        "multiplier bits 65": (lambda e: _stages(convert={"multiplier_bits": 65}), SpecError,
                               "stages.convert.multiplier_bits"),
        "negative threshold": (lambda e: _spec(compare={"thresholds": {"max_qscale_diff": -1}}),
                               SpecError, "compare.thresholds.max_qscale_diff"),
        "negative time limit": (lambda e: _spec(limits={"stage_seconds": -5}), SpecError,
                                "limits.stage_seconds"),
        "batch size 0": (lambda e: _data(batch_size=0), SpecError, "data.batch_size"),
        "unknown input format": (lambda e: _data(input_format="rgba"), SpecError,
                                 "data.input_format"),
        "unknown runtime format": (lambda e: _stages(board_sim={"runtime_format": "jpeg"}),
                                   SpecError, "stages.board_sim.runtime_format"),
        "unknown fault kind": (lambda e: _spec(faults=[{"kind": "gremlin", "layer": "conv"}]),
                               SpecError, "faults.0.kind"),
        "fault without a layer": (lambda e: _spec(faults=[{"kind": "bias_drop"}]), SpecError,
                                  "layer or an op_type"),
        "tag not a string": (lambda e: _spec(tags={"owner": ["a", "b"]}), SpecError,
                             "tags.owner"),
        "stop after an unknown stage": (lambda e: _stages(stop_after="deploy"), SpecError,
                                        "stages.stop_after"),
        "two problems at once": (lambda e: _spec(quant={"march": "x", "observer": "y"}),
                                 SpecError, "quant.observer"),
        "set without a value": (lambda e: with_overrides(_spec(), ["quant.march"]), SpecError,
                                "quant.march"),
        "set of an unknown field": (lambda e: with_overrides(_spec(), ["quant.marhc=nash-m"]),
                                    SpecError, "quant.marhc"),
        "set of invalid yaml": (lambda e: with_overrides(_spec(), ["quant.march=[nash"]),
                                SpecError, "quant.march"),
    }  # fmt: skip


# -- sweeps and schedules ------------------------------------------------------------------


SWEEP = "name: s\nspec: sweep-spec.yaml\n"
MARCH = "matrix: {quant.march: [nash-e]}\n"


def _sweep(env, text: str, name: str = "sweep.yaml"):
    from pipelines.sweep import load_sweep

    spec = env.tmp / "sweep-spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict()))
    path = env.tmp / name
    path.write_text(text)
    return load_sweep(path)


def _schedule(env, timezone: str):
    from pipelines.schedule import schedule

    _sweep(env, SWEEP + MARCH)
    return schedule(env.tmp / "sweep.yaml", "0 2 * * *", env.tmp / "sched", timezone=timezone)


def sweep_cases() -> dict:
    return {
        "sweep with an empty matrix": (lambda e: _sweep(e, SWEEP + "matrix: {}\n"), SpecError,
                                       "matrix"),
        "sweep with an unknown key": (lambda e: _sweep(e, SWEEP + MARCH + "runnner: {}\n"),
                                      SpecError, "runnner"),
        "sweep of a missing spec": (lambda e: _sweep(e, "name: s\nspec: gone.yaml\n" + MARCH),
                                    SpecError, "gone.yaml"),
        "sweep of an unknown field": (lambda e: _sweep(e, SWEEP + "matrix: {quant.nope: [1]}\n"),
                                      SpecError, "quant.nope"),
        "schedule in no time zone": (lambda e: _schedule(e, "Not/AZone"), SpecError,
                                     "Not/AZone"),
    }  # fmt: skip


# -- models and datasets -------------------------------------------------------------------


def returns_a_dict() -> dict:
    """A model factory that returns the state dict instead of the model."""
    from tests.models import tiny

    return tiny().state_dict()


def raises() -> None:
    """A model factory that fails on its own."""
    raise RuntimeError("weights server unreachable")


def column_labels() -> dict:
    """Labels as an (N, 1) column: they would broadcast against (N,) predictions."""
    d = tiny_data()
    d["evaluation"] = (d["evaluation"][0], d["evaluation"][1][:, None])
    return d


def _float(factory: str):
    from stages.modelio import build_float

    return build_float(factory)


def model_cases() -> dict:
    return {
        "zoo model that does not exist": (lambda e: _float("examples.zoo.models:resnet9000"),
                                          SpecError, "resnet9000"),
        "factory returns a state dict": (lambda e: _float(f"{HERE}:returns_a_dict"),
                                         SpecError, "model.factory"),
        "factory raises": (lambda e: _float(f"{HERE}:raises"), StageError,
                           "weights server unreachable"),
        "labels of shape (N, 1)": (lambda e: load_splits(f"{HERE}:column_labels", 32, 32),
                                   StageError, "data.evaluation"),
        "split shorter than asked": (lambda e: load_splits("tests.models:data", 32, 65),
                                     StageError, "asks for 65"),
    }  # fmt: skip


# -- corrupted run files -------------------------------------------------------------------


def _layers(env, text: str):
    from analysis.layer_graph import load_layers

    run = _copied_run(env)
    run.path("artifacts/prepare/layers.json").write_text(text)
    return load_layers(run)


DEEP = "[" * 100_000 + "]" * 100_000
"""JSON nested past the recursion limit of Python's json parser."""


def _manifest(env, text: str):
    run = _copied_run(env)
    (run.root / "manifest.json").write_text(text)
    return run.manifest()


def _missing_stage_file(env):
    from schemas.artifacts import QuantizedModel

    run = _copied_run(env)
    run.path("artifacts/convert/quantized.onnx").unlink()
    return run.load_artifact("convert", QuantizedModel)


def _foreign_part(env, columns: dict):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas.table_digests import write_part
    from schemas.tables import read_run_table

    run = _copied_run(env)
    part = next(run.path("tables/metrics").glob("*.parquet"))
    rel = str(part.relative_to(run.root))  # recorded: its digest is right, its schema not
    write_part(run, rel, lambda path: pq.write_table(pa.table(columns), path))
    return read_run_table(run, "metrics")


def _hbm_header(env, edit):
    from simulator.program import hbm

    path = env.copy_of("artifacts/compile/model.hbm")
    data = path.read_bytes()
    hlen = int.from_bytes(data[6:10], "little")
    header = json.loads(data[10 : 10 + hlen])
    edit(header)
    path.write_bytes(hbm.pack(header, data[10 + hlen : -hbm.DIGEST]))
    return hbm.load(path)


def _unknown_op(header: dict) -> None:
    header["instructions"][0]["op"] = "teleport"


TEXT_VALUE = {"run_id": ["r"], "stage": ["prepare"], "metric": ["top1"], "value": ["high"]}


def file_cases() -> dict:
    return {
        "layers.json truncated": (lambda e: _layers(e, '[{"node": "x", "lay'), ArtifactError,
                                  "layers.json"),
        "layers.json of another shape": (lambda e: _layers(e, '{"conv": 1}'), ArtifactError,
                                         "layers.json"),
        "manifest not json": (lambda e: _manifest(e, "{not json"), ArtifactError,
                              "manifest.json"),
        "manifest nested past the parser": (lambda e: _manifest(e, DEEP), ArtifactError,
                                            "manifest.json"),
        "layers.json nested past the parser": (lambda e: _layers(e, DEEP), ArtifactError,
                                               "layers.json"),
        "stage file missing": (_missing_stage_file, ArtifactError, "quantized.onnx"),
        "tables part of another table": (lambda e: _foreign_part(e, {"stage": [1]}),
                                         ArtifactError, "run_id"),
        "tables part with text values": (lambda e: _foreign_part(e, TEXT_VALUE), ArtifactError,
                                         "'high'"),
        "hbm op unknown, checksum right": (lambda e: _hbm_header(e, _unknown_op),
                                           SimulatorError, "teleport"),
        "hbm header without constants": (lambda e: _hbm_header(e, lambda h: h.pop("constants")),
                                          SimulatorError, "constants"),
    }  # fmt: skip


# -- SQL and run ids -----------------------------------------------------------------------


def _show(env, run_id: str):
    from rich.console import Console

    from qparity.views import show_run

    return show_run(Console(file=io.StringIO()), env.root, run_id)


def _diff(env, a: str, b: str):
    from analysis.diff import diff_runs

    return diff_runs(env.root, a, b)


def _report(env, run_id: str):
    from analysis.report import write_report

    return write_report(RunStore(env.root).open(run_id), env.tmp / "r.html")


def _edit(env, numbers: str, run_id: str | None = None):
    from analysis.edit_run import edit_run

    return edit_run(env.root, run_id or env.run_id, numbers)


def query_cases() -> dict:
    return {
        "sql empty statement": (lambda e: _sql(e, "  ;  "), QueryError, "got 0"),
        "sql two statements": (lambda e: _sql(e, "SELECT 1; SELECT 2"), QueryError,
                               "one statement"),
        "sql write through a cte": (lambda e: _sql(e, "WITH t AS (SELECT 1) INSERT INTO runs "
                                    "SELECT * FROM t"), QueryError, "INSERT"),
        "sql read_csv outside the store": (lambda e: _sql(e, "SELECT * FROM "
                                           "read_csv('/etc/passwd')"), QueryError, "/etc/passwd"),
        "show of a missing run": (lambda e: _show(e, "tiny-20000101T000000-000000"),
                                  ArtifactError, "tiny-20000101T000000-000000"),
        "diff of a missing run": (lambda e: _diff(e, e.run_id, "nope-run"), QueryError,
                                  "nope-run"),
        "report of an invalid run id": (lambda e: _report(e, "../x"), ArtifactError, "../x"),
        "edit of a backwards range": (lambda e: _edit(e, "5-3"), SpecError,
                                      "--remove-fake-quant"),
        "edit of a missing run": (lambda e: _edit(e, "1", "gone-run"), ArtifactError,
                                  "gone-run"),
    }  # fmt: skip


def cases() -> dict:
    return {**spec_cases(), **sweep_cases(), **model_cases(), **file_cases(), **query_cases()}
