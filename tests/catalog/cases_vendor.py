"""Hostile inputs of the nightly schedule and the vendor-style analysis files (issue #22,
items 27 and 28), for the catalog (tests/catalog/test_bad_inputs.py)."""

from __future__ import annotations

from schemas.errors import SpecError
from tests.catalog.cases_hostile import MARCH, SWEEP, _sweep


def _schedule(env, cron: str, timezone: str = "UTC"):
    from pipelines.schedule import schedule

    _sweep(env, SWEEP + MARCH)
    return schedule(env.tmp / "sweep.yaml", cron, env.tmp / "sched", timezone=timezone)


def cases() -> dict:
    return {**schedule_cases(), **sweep_cases()}


def schedule_cases() -> dict:
    return {
        # croniter reads a sixth field as seconds: 60 sweeps, one a second from 02:00:00
        "schedule with a seconds field": (lambda e: _schedule(e, "0 2 * * * *"), SpecError,
                                          "'0 2 * * * *' is not a cron expression"),
        "schedule of four fields": (lambda e: _schedule(e, "0 2 * *"), SpecError, "--cron"),
        # `--timezone "$TZ"` with TZ unset: was silently UTC
        "schedule in an empty time zone": (lambda e: _schedule(e, "0 2 * * *", ""), SpecError,
                                           "--timezone"),
        "schedule in a lower-case zone": (lambda e: _schedule(e, "0 2 * * *", "europe/berlin"),
                                          SpecError, "europe/berlin"),
    }  # fmt: skip


def sweep_cases() -> dict:
    """Two runs of one label share their tags: the sweep's record of one was lost."""
    return {
        "sweep with a repeated matrix value": (
            lambda e: _sweep(e, SWEEP + "matrix: {quant.march: [nash-e, nash-e]}\n"),
            SpecError, "same combination (quant.march=nash-e)"),
        "sweep whose include repeats a run": (
            lambda e: _sweep(e, SWEEP + MARCH + "include: [{quant.march: nash-e}]\n"),
            SpecError, "same combination (quant.march=nash-e)"),
        "sweep of two specs of one name": (lambda e: _two_specs(e), SpecError, "spec=tiny"),
    }  # fmt: skip


def _two_specs(env):
    import yaml

    from tests.conftest import tiny_spec_dict

    for folder in ("a", "b"):
        (env.tmp / folder).mkdir(exist_ok=True)
        (env.tmp / folder / "tiny.yaml").write_text(yaml.safe_dump(tiny_spec_dict()))
    return _sweep(env, "name: s\nmatrix: {spec: [a/tiny.yaml, b/tiny.yaml]}\n")
