"""Hostile inputs of localization for the catalog (tests/catalog/test_bad_inputs.py): its
spec fields out of range, a run with too few stages to compare, a metrics part changed
after the run wrote it (localization must fail before it rewrites anything), named queries
over first_divergences given parameters they do not take.

Every case works on a scratch copy of the catalog's complete run, a tiny run of its own in
the scratch folder, or reads the store: the complete run is never changed.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from schemas.errors import ArtifactError, QueryError, SpecError
from tests.catalog.cases_files import _copied_run


def _spec(**compare):
    from schemas.spec import parse_spec
    from tests.conftest import tiny_spec_dict

    return parse_spec(tiny_spec_dict(compare=compare), "s.yaml")


def _localize(run):
    from analysis.analyze import analyze
    from schemas.spec import load_spec
    from stages.context import RunContext

    ctx = RunContext(spec=load_spec(run.path("spec.yaml")), run=run, code_version="")
    return analyze(ctx)


def _stopped_at_prepare(env):
    from pipelines.flow import run_chain
    from schemas.spec import parse_spec
    from schemas.store import RunStore
    from tests.conftest import tiny_spec_dict

    data = tiny_spec_dict(stages={"stop_after": "prepare"}, compare={"enabled": False})
    root = env.tmp / "prepare-only"
    result = run_chain(parse_spec(data, "t"), yaml.safe_dump(data), root, use_prefect=False)
    return _localize(RunStore(root).open(result.run_id))


def _tampered_metrics(env):
    run = _copied_run(env)
    path = run.path("tables/metrics/calibrate.parquet")
    rows = pq.read_table(path).to_pylist()
    rows[0]["value"] = 1.0 - rows[0]["value"]  # a calibrate top-1 that never was
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    return _localize(run)


def _named(env, name: str, **params):
    from analysis.query import named

    return named(env.root, name, **params)


def cases() -> dict:
    return {
        "loc: negative probe samples": (lambda e: _spec(probe_samples=-1), SpecError,
                                        "compare.probe_samples"),
        "loc: fractional probe samples": (lambda e: _spec(probe_samples=2.5), SpecError,
                                          "compare.probe_samples"),
        "loc: cosine threshold above 1": (lambda e: _spec(thresholds={"cosine": 1.5}),
                                          SpecError, "compare.thresholds.cosine"),
        "loc: negative top-1 drop": (lambda e: _spec(thresholds={"top1_drop": -0.1}),
                                     SpecError, "compare.thresholds.top1_drop"),
        "loc: negative primary drop": (lambda e: _spec(thresholds={"primary_drop": -1}),
                                       SpecError, "compare.thresholds.primary_drop"),
        "loc: unknown bad-case metric": (lambda e: _spec(badcase_metric="psnr"), SpecError,
                                         "compare.badcase_metric"),
        "loc: primary metric not a name": (lambda e: _spec(primary="top1; DROP"), SpecError,
                                           "compare.primary"),
        "loc: run with one comparable stage": (_stopped_at_prepare, QueryError, "prepare"),
        "loc: metrics part changed before localize": (_tampered_metrics, ArtifactError,
                                                      "calibrate.parquet"),
        "loc: first_divergence given a parameter": (lambda e: _named(e, "first_divergence",
                                                    stage="convert"), QueryError, "stage"),
    }  # fmt: skip
