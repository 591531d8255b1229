"""Reach the Prefect API before a flow runs: a configured server, else the temporary one.

With ``PREFECT_API_URL`` set, that server is used as it is (one health check). Without it
Prefect starts a temporary local server in a subprocess and waits for it, 20 s by default:
on a loaded machine that is too short ("Timed out while attempting to connect to ephemeral
Prefect API server"). Here the wait is ``$QPARITY_PREFECT_STARTUP_S`` (default 90 s) and a
start that still times out is tried once more; then an :class:`OrchestrationError` says
what happened and what to do instead of an internal error.
"""

from __future__ import annotations

import os
import time

from schemas.errors import OrchestrationError

STARTUP_ENV = "QPARITY_PREFECT_STARTUP_S"
DEFAULT_STARTUP_S = 90
ATTEMPTS = 2
_HINT = (
    "rerun with --no-prefect (the same stages, called directly), or start a server "
    "(`prefect server start`) and set PREFECT_API_URL to it"
)


def _healthcheck() -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.api_healthcheck()


def _startup_s() -> int:
    raw = os.environ.get(STARTUP_ENV, str(DEFAULT_STARTUP_S))
    try:
        return max(1, int(float(raw)))
    except ValueError:
        raise OrchestrationError(
            f"${STARTUP_ENV} is {raw!r}, not a number of seconds",
            where=STARTUP_ENV,
            hint=f"set it to the seconds to wait for the temporary server (default {DEFAULT_STARTUP_S})",
        ) from None


def prefect_ready(check=_healthcheck) -> float:
    """Reach the Prefect API (starting the temporary local server if none is configured);
    returns the seconds it took, so run times can be reported without server start-up."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    t0, url = time.perf_counter(), PREFECT_API_URL.value()
    wait = _startup_s()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with temporary_settings({PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: wait}):
                check()
            return time.perf_counter() - t0
        except Exception as e:  # httpx, RuntimeError("Timed out..."), OSError
            if url or attempt == ATTEMPTS:
                raise _failure(url, wait, e) from e
    raise AssertionError("unreachable")


def _failure(url: str | None, wait: int, e: Exception) -> OrchestrationError:
    cause = " ".join(str(e).split())[:200] or type(e).__name__
    if url:
        what = f"the Prefect server at {url} (PREFECT_API_URL) does not answer: {cause}"
    else:
        what = (f"the temporary Prefect server did not start within {wait} s, "
                f"{ATTEMPTS} attempts (the machine may be busy): {cause}")  # fmt: skip
    return OrchestrationError(what, where="prefect", hint=f"{_HINT}; or raise ${STARTUP_ENV}")
