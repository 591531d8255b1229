"""Scheduling a sweep: refused without a server, visible on one with its cron schedule."""

from __future__ import annotations

import pytest

from pipelines.schedule import FLOW_NAME, schedule
from schemas.errors import QparityError, SpecError
from tests.pipelines.test_sweep import SWEEP, prefect_api, write_sweep  # noqa: F401


def test_without_a_server_schedule_says_how_to_start_one(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(QparityError) as e:
        schedule(write_sweep(tmp_path, SWEEP), "0 2 * * *")
    assert "prefect server start" in e.value.message and "PREFECT_API_URL" in e.value.message


def test_a_bad_cron_string_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="--cron: '0 2 \\* \\*' is not a cron expression"):
        schedule(write_sweep(tmp_path, SWEEP), "0 2 * *")


def test_an_unknown_time_zone_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="--timezone: 'Europe/Berlln' is not a time zone"):
        schedule(write_sweep(tmp_path, SWEEP), "0 2 * * *", timezone="Europe/Berlln")


def test_the_deployment_is_on_the_server_with_its_schedule(prefect_api, tmp_path):  # noqa: F811
    from prefect.client.orchestration import get_client

    path = write_sweep(tmp_path, SWEEP)
    first = schedule(path, "0 2 * * *", tmp_path / "runs")
    again = schedule(path, "30 1 * * 1-5", tmp_path / "runs", timezone="Europe/Berlin")
    assert first.id == again.id and again.name == f"{FLOW_NAME}/tiny-sweep"  # an update
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(again.name)
        pool = client.read_work_pool(dep.work_pool_name)
    got = [(s.schedule.cron, s.schedule.timezone) for s in dep.schedules]
    assert got == [("30 1 * * 1-5", "Europe/Berlin")] and again.timezone == "Europe/Berlin"
    assert dep.parameters == {"sweep_path": str(path), "store_root": str(tmp_path / "runs")}
    assert dep.entrypoint == "pipelines.schedule.scheduled_sweep" and pool.type == "process"
    assert again.api_url == prefect_api
