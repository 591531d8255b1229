"""Nightly sweeps: a Prefect deployment with a cron schedule, on a Prefect server.

:func:`schedule` registers the flow ``qparity-scheduled-sweep`` (deployment name = the
sweep's name) in a ``process`` work pool (created if missing) with the sweep file and the
run store as parameters. A worker started with ``prefect worker start --pool qparity``
executes each scheduled run: the flow reads the sweep file and runs it as a child flow run
``qparity-sweep`` (so a ``runner: {kind: dask}`` in the file is honoured: a flow's task
runner is fixed when it starts, and only the sweep file knows which one to use).

The entrypoint is a module path (``pipelines.schedule.scheduled_sweep``), so the worker's
Python must have qparity installed; nothing is uploaded or built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# isort: off
import pipelines.flow  # noqa: F401  (first: it sets the quiet Prefect defaults)
from prefect import flow

# isort: on
from schemas.errors import QparityError, SpecError
from schemas.remote import absolute_root

FLOW_NAME = "qparity-scheduled-sweep"
POOL = "qparity"
NO_SERVER_HINT = (
    "start one with `prefect server start --host 127.0.0.1` and set "
    "PREFECT_API_URL=http://127.0.0.1:4200/api"
)


@flow(name=FLOW_NAME, persist_result=False)
def scheduled_sweep(sweep_path: str, store_root: str) -> list[dict]:
    """Run a sweep file into a run store (the body of every scheduled run); the flow run
    fails, after every run has had its turn, if any run failed, so the UI shows it red."""
    from dataclasses import asdict

    from pipelines.sweep import run_sweep

    result = run_sweep(Path(sweep_path), store_root)
    if result.failed:
        labels = ", ".join(f"{r.label} ({r.run_id or 'no run'})" for r in result.failed)
        raise QparityError(
            f"{len(result.failed)} of {len(result.runs)} runs failed: {labels}",
            where=f"sweep {result.sweep_id}",
            hint="see the sweep-summary artifact, or qparity show RUN_ID",
        )
    return [asdict(r) for r in result.runs]


@dataclass(frozen=True)
class Deployment:
    """A registered deployment: where to find it and what runs it."""

    id: str
    name: str
    """``flow name/deployment name``, as ``prefect deployment run`` takes it."""
    work_pool: str
    cron: str
    timezone: str
    """IANA name of the zone the cron fields are read in, e.g. Europe/Berlin."""
    api_url: str


def schedule(
    sweep_path: str | Path,
    cron: str,
    store_root: str | Path | None = None,
    pool: str = POOL,
    timezone: str = "UTC",
) -> Deployment:
    """Register (or update) the deployment running ``sweep_path`` on ``cron``, read in
    ``timezone`` (an IANA name; "0 2 * * *" in Europe/Berlin is 02:00 there, DST included).

    Raises SpecError for a bad sweep file, cron string or time zone, QparityError when no
    Prefect server is configured or it cannot be reached (the temporary server dies with
    this process).
    """
    from pipelines.sweep import load_sweep
    from schemas.remote import default_store_root

    sweep_path = Path(sweep_path).resolve()
    sweep = load_sweep(sweep_path)  # a bad sweep fails here, before anything is registered
    cron_schedule = _cron_schedule(cron, timezone)
    api_url = _server()
    _ensure_pool(pool)
    root = absolute_root(store_root or default_store_root())
    deployment_id = _deploy(sweep.name, sweep_path, root, cron_schedule, pool)
    name = f"{FLOW_NAME}/{sweep.name}"
    return Deployment(str(deployment_id), name, pool, cron, timezone, api_url)


def _deploy(name: str, sweep_path: Path, root: str | Path, cron_schedule, pool: str):
    from prefect.deployments.runner import EntrypointType

    deployment = scheduled_sweep.to_deployment(
        name=name,
        schedule=cron_schedule,
        parameters={"sweep_path": str(sweep_path), "store_root": str(root)},
        description=f"qparity sweep {sweep_path} into {root}",
        tags=["qparity", "sweep"],
        work_pool_name=pool,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    return deployment.apply(work_pool_name=pool)  # registers only: nothing built or printed


NICKNAMES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                       "@hourly"})  # fmt: skip
"""The cron nicknames accepted besides five fields (one run per period)."""


def _cron_schedule(cron: str, timezone: str):
    """Prefect's CronSchedule of ``cron`` in ``timezone``; SpecError naming the bad one.

    Only five fields (or a nickname such as @daily): croniter reads a sixth field as
    seconds, so "0 2 * * * *" would start the sweep 60 times, once a second from 02:00:00.
    An empty time zone would silently mean UTC."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        if len(cron.split()) != 5 and cron.strip() not in NICKNAMES:
            raise ValueError(f"{len(cron.split())} fields")
        CronSchedule(cron=cron)
    except (ValueError, ValidationError) as e:
        raise SpecError(
            f"{cron!r} is not a cron expression of five fields",
            where="--cron",
            hint='five fields: minute hour day month weekday, e.g. "0 2 * * *" (or @daily)',
        ) from e
    try:
        if not timezone.strip():
            raise ValueError("empty")
        return CronSchedule(cron=cron, timezone=timezone)
    except (ValueError, ValidationError) as e:
        raise SpecError(
            f"{timezone!r} is not a time zone",
            where="--timezone",
            hint="an IANA name such as UTC, Europe/Berlin or America/New_York",
        ) from e


def _server() -> str:
    """The configured Prefect API URL, checked to answer."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise QparityError(
            "no Prefect server is configured: a schedule needs one that keeps running",
            where="PREFECT_API_URL",
            hint=NO_SERVER_HINT,
        )
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise QparityError(
            f"the Prefect server at {url} does not answer ({type(problem).__name__})",
            where="PREFECT_API_URL",
            hint=NO_SERVER_HINT,
        )
    return url


def _ensure_pool(pool: str) -> None:
    """Create the ``process`` work pool if it does not exist yet."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(
                WorkPoolCreate(name=pool, type="process", base_job_template=template)
            )
