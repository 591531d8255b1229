"""A run's manifest.json: what ran, with what, and how each stage went."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageRecord(_Record):
    """One stage's entry in a run manifest."""

    stage: str
    """Stage name."""
    status: Literal["running", "complete", "failed", "skipped", "interrupted"]
    """Where the stage is (interrupted: its run's process died while it ran)."""
    started_at: str
    """ISO-8601 UTC start time."""
    finished_at: str | None = None
    """ISO-8601 UTC end time, once it ended."""
    duration_s: float | None = None
    """Wall time in seconds, once it ended."""
    cache_hit: bool = False
    """True if the artifact came from the cache instead of being computed."""
    cache_source_run: str | None = None
    """The run the cached artifact was first computed in."""
    artifact_digest: str | None = None
    """Digest of the stage's artifact, once complete."""
    error: str | None = None
    """The error message, if the stage failed."""


class RunOwner(_Record):
    """The process running a run, and when it last said it was alive (schemas.owner)."""

    host: str
    """Host name of the machine the process runs on."""
    pid: int
    """Its process id on that host."""
    process: str | None = None
    """``<boot id>:<start time in clock ticks>`` of the process (Linux ``/proc``): a pid
    reused by another process, or a reboot, no longer matches it. None where unknown."""
    heartbeat_at: str
    """ISO-8601 UTC time of the process's last manifest write or heartbeat."""


class Manifest(_Record):
    """A run's manifest.json: what ran, with what, and how it went."""

    run_id: str
    """The run's id (its folder name)."""
    name: str
    """The pipeline name from the spec."""
    spec_digest: str
    """Digest of the validated spec."""
    status: Literal["running", "complete", "failed", "interrupted"]
    """Where the run is (interrupted: its process died before it ended; see ``owner``)."""
    started_at: str
    """ISO-8601 UTC start time."""
    finished_at: str | None = None
    """ISO-8601 UTC end time, once it ended."""
    stages: dict[str, StageRecord] = {}
    """Stage records by stage name."""
    code_version: str
    """Version of qparity's code that made the run."""
    versions: dict[str, str] = {}
    """Versions of the libraries involved."""
    tags: dict[str, str] = {}
    """Labels from the spec."""
    parent_run: str | None = None
    """The run this one was rerun from, if any."""
    error: str | None = None
    """The error message, if the run failed or was interrupted."""
    owner: RunOwner | None = None
    """The process running the run, recorded when it starts (None in older runs)."""
    tables: dict[str, str] | None = None
    """sha256 of every table part the run wrote (``tables/<table>/<part>.parquet`` ->
    digest), checked by every reader (:mod:`schemas.table_digests`). None in runs written
    before digests were recorded: their tables are read unverified, with a warning."""
    tables_pending: dict[str, str | None] = {}
    """Parts being written (their new digest, recorded before the file is renamed into
    place) or deleted (None): a run killed midway still verifies, the part matching either
    digest or being absent."""
