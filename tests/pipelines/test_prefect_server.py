"""Reaching Prefect on a busy machine: a longer wait, one retry, a clear error."""

from __future__ import annotations

import pytest
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    temporary_settings,
)

from pipelines.prefect_server import prefect_ready
from schemas.errors import OrchestrationError

TIMED_OUT = RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server.")


def _checks(*outcomes):
    """A health check failing or passing in turn; records the wait it was given."""
    seen = []

    def check():
        seen.append(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
        outcome = outcomes[len(seen) - 1]
        if isinstance(outcome, Exception):
            raise outcome

    return check, seen


def test_a_start_that_times_out_is_tried_again_with_a_longer_wait(monkeypatch):
    monkeypatch.delenv("QPARITY_PREFECT_STARTUP_S", raising=False)
    check, seen = _checks(TIMED_OUT, None)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert prefect_ready(check) >= 0
    assert seen == [90, 90]  # Prefect's own default is 20 s


def test_a_server_that_never_starts_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("QPARITY_PREFECT_STARTUP_S", "5")
    check, seen = _checks(TIMED_OUT, TIMED_OUT)
    no_url = temporary_settings(restore_defaults={PREFECT_API_URL})
    with no_url, pytest.raises(OrchestrationError, match="within 5 s, 2 attempts") as e:
        prefect_ready(check)
    assert seen == [5, 5] and "--no-prefect" in e.value.hint
    assert "PREFECT_API_URL" in e.value.hint


def test_a_configured_server_is_used_as_is_and_named_when_it_fails():
    check, seen = _checks(ConnectionError("connection refused"))
    url = temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"})
    with url, pytest.raises(OrchestrationError, match=r"127\.0\.0\.1:9/api .*does not answer"):
        prefect_ready(check)
    assert len(seen) == 1  # no retry: nothing of ours to restart


def test_a_wait_that_is_not_a_number_is_named(monkeypatch):
    monkeypatch.setenv("QPARITY_PREFECT_STARTUP_S", "soon")
    with pytest.raises(OrchestrationError, match="QPARITY_PREFECT_STARTUP_S is 'soon'"):
        prefect_ready(lambda: None)
