"""The catalog of bad inputs: each gives an error of our own type that names the thing and
the fix; nothing already written is lost; other runs are untouched.

Cases are rows of :data:`CASES` (id -> function that must raise); each function gets a
:class:`Env` holding a complete tiny run to corrupt copies of. A case also names the text
its message must contain (the file, field, layer or stage at fault).
"""

from __future__ import annotations

import errno
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipelines.flow import run_chain
from schemas.errors import ArtifactError, QparityError, QueryError, SpecError
from schemas.spec import load_spec, parse_spec
from schemas.store import RunStore
from tests.catalog import (
    cases_analysis,
    cases_batch,
    cases_cam,
    cases_cli,
    cases_clip,
    cases_contract,
    cases_data,
    cases_edit,
    cases_exact,
    cases_files,
    cases_hostile,
    cases_inputs,
    cases_loc,
    cases_outputs,
    cases_ptq_batch,
    cases_ptq_io,
    cases_sec,
    cases_show,
    cases_store,
    cases_tables,
    cases_threads,
    cases_vendor,
)
from tests.conftest import tiny_spec_dict


@dataclass
class Env:
    """A store with one complete tiny run, and a scratch folder."""

    root: Path
    run_id: str
    tmp: Path

    @property
    def run(self):
        return RunStore(self.root).open(self.run_id)

    def copy_of(self, rel: str) -> Path:
        """A scratch copy of one of the run's files (the run itself is never touched)."""
        dst = self.tmp / Path(rel).name
        shutil.copy(self.run.path(rel), dst)
        return dst


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = tiny_spec_dict(compare={"enabled": False})
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return Env(root, result.run_id, tmp_path_factory.mktemp("scratch"))


def _spec(tmp: Path, text: str) -> Path:
    path = tmp / "bad.yaml"
    path.write_text(text)
    return path


def spec_cases() -> dict:
    t = tiny_spec_dict
    return {
        "spec unknown key": (lambda e: parse_spec(t(quant={"obsrever": "x"}), "s.yaml"),
                             SpecError, "quant.obsrever"),
        "spec wrong type": (lambda e: parse_spec(t(data={**t()["data"], "batch_size": "big"}),
                            "s.yaml"), SpecError, "data.batch_size"),
        "spec missing model": (lambda e: parse_spec({k: v for k, v in t().items() if k != "model"},
                               "s.yaml"), SpecError, "model"),
        "spec empty file": (lambda e: load_spec(_spec(e.tmp, "")), SpecError, "empty"),
        "spec not yaml": (lambda e: load_spec(_spec(e.tmp, "a: [1,\n")), SpecError, "line"),
        "spec top level list": (lambda e: load_spec(_spec(e.tmp, "- 1\n")), SpecError, "mapping"),
        "spec file missing": (lambda e: load_spec(e.tmp / "nope.yaml"), SpecError, "nope.yaml"),
        "spec bad level": (lambda e: parse_spec(t(quant={"consistency_level": 7}), "s.yaml"),
                           SpecError, "quant.consistency_level"),
        "conflicting run and qat": (lambda e: _plan(t(stages={"run": ["qat"]})), SpecError,
                                    "stages.run"),
        "fault at the wrong stage": (lambda e: parse_spec(t(faults=[{"kind": "bias_drop",
                                     "stage": "compile", "layer": "conv"}]), "s.yaml"),
                                     SpecError, "faults"),
        "unknown named pipeline": (lambda e: parse_spec(t(pipeline="nope"), "s.yaml"), SpecError,
                                   "nope"),
        "negative compare samples": (lambda e: parse_spec(t(compare={"samples": 0}), "s.yaml"),
                                     SpecError, "compare.samples"),
        "zero saturation samples": (
            lambda e: parse_spec(t(stages={"convert": {"saturation_samples": 0}}), "s.yaml"),
            SpecError, "stages.convert.saturation_samples"),
        "run id with path separators": (lambda e: RunStore(e.root).open("../etc"),
                                        ArtifactError, "../etc"),
        "sql that writes": (lambda e: _sql(e, "CREATE TABLE x AS SELECT 1"), QueryError,
                            "read-only"),
        "sql copy to a file": (lambda e: _sql(e, "COPY runs TO '/tmp/x.csv'"), QueryError, "COPY"),
        "sql unknown table": (lambda e: _sql(e, "SELECT * FROM nothere"), QueryError, "nothere"),
    }  # fmt: skip


def _plan(data):
    from stages.registry import plan

    return plan(parse_spec(data, "s.yaml"))


def _sql(env: Env, query: str):
    from analysis.query import run_sql

    return run_sql(env.root, query)


def all_cases() -> dict:
    return {
        **spec_cases(),
        **cases_data.cases(),
        **cases_contract.cases(),
        **cases_files.cases(),
        **cases_show.cases(),
        **cases_batch.cases(),
        **cases_cli.cases(),
        **cases_inputs.cases(),
        **cases_analysis.cases(),
        **cases_tables.cases(),
        **cases_hostile.cases(),
        **cases_outputs.cases(),
        **cases_edit.cases(),
        **cases_exact.cases(),
        **cases_cam.cases(),
        **cases_loc.cases(),
        **cases_vendor.cases(),
        **cases_store.cases(),
        **cases_sec.cases(),
        **cases_ptq_io.cases(),
        **cases_ptq_batch.cases(),
        **cases_threads.cases(),
        **cases_clip.cases(),
    }


CASES = all_cases()


def test_the_catalog_has_at_least_90_cases():
    assert len(CASES) >= 90


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_our_error_naming_the_thing(env, case):
    fn, cls, names = CASES[case]
    before = _snapshot(env)
    with pytest.raises(QparityError) as info:
        fn(env)
    err = info.value
    assert isinstance(err, cls), f"{case}: {type(err).__name__}: {err}"
    assert names in err.message, f"{case}: {err.message!r} does not name {names!r}"
    assert err.hint, f"{case}: no fix in {err.message!r}"
    assert _snapshot(env) == before, f"{case}: the complete run changed"


def _snapshot(env: Env) -> dict:
    """Every file of the complete run: size and manifest status (nothing may change)."""
    run = env.run
    files = {p.relative_to(run.root).as_posix(): p.stat().st_size for p in run.root.rglob("*")
             if p.is_file() and p.name != "report.html"}  # fmt: skip
    return {"files": files, "status": run.manifest().status}


def test_a_full_disk_leaves_the_old_file_intact(env, monkeypatch):
    import os

    from schemas.fileio import atomic_write_text

    target = env.tmp / "kept.txt"
    atomic_write_text(target, "old")

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(ArtifactError, match="No space left") as info:
        atomic_write_text(target, "new")
    assert "free disk space" in info.value.message
    assert target.read_text() == "old"
    assert not [p for p in env.tmp.iterdir() if ".tmp-" in p.name]


def test_nan_data_fails_the_run_and_leaves_other_runs_untouched(env, tmp_path):
    before = _snapshot(env)
    data = tiny_spec_dict(
        data={**tiny_spec_dict()["data"], "dataset": "tests.catalog.cases_data:nan_data"}
    )
    with pytest.raises(QparityError, match="NaN"):
        run_chain(parse_spec(data, "t"), yaml.safe_dump(data), env.root, use_prefect=False)
    failed = [m for m in RunStore(env.root).list_runs() if m.run_id != env.run_id]
    assert failed and all(m.status == "failed" for m in failed)
    assert _snapshot(env) == before
