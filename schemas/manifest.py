"""A run's manifest.json: what ran, with what, and how each stage went.

The records are :class:`schemas.records.Record` dataclasses (frozen, checked against
their annotations), not pydantic models: every data command (`runs`, `show`, `sql`) reads
manifests, and importing pydantic costs about 90 ms of CPU, more than the rest of `qparity
show` above its libraries (bench/README.md, "Manifests without pydantic"). A manifest that
does not match its fields raises :class:`ManifestError` naming the field; readers turn it
into an ArtifactError.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from schemas.records import ManifestError, Record

__all__ = ["Judging", "Manifest", "ManifestError", "RunOwner", "StageRecord"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageRecord(Record):
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOwner(Record):
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Judging(Record):
    """The settings a run's stages are judged by (analysis.primary), resolved from its
    spec when the run starts, so `qparity show` prints the run's primary metric without
    parsing the spec."""

    primary: str | None = None
    """``compare.primary`` (None: top1 with labels, else the output cosine)."""
    output: str | None = None
    """``compare.output``: the judged output (None: chosen from the metrics rows)."""
    top1_drop: float
    """``compare.thresholds.top1_drop``."""
    primary_drop: float | None = None
    """``compare.thresholds.primary_drop`` (None: top1_drop)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest(Record):
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
    stages: dict[str, StageRecord] = dataclasses.field(default_factory=dict)
    """Stage records by stage name."""
    code_version: str
    """Version of qparity's code that made the run."""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    """Versions of the libraries involved."""
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    """Labels from the spec."""
    parent_run: str | None = None
    """The run this one was rerun from, if any."""
    error: str | None = None
    """The error message, if the run failed or was interrupted."""
    owner: RunOwner | None = None
    """The process running the run, recorded when it starts (None in older runs)."""
    judging: Judging | None = None
    """What its stages are judged by, recorded when it starts (None in older runs and
    where the spec has no ``compare`` section: readers parse spec.yaml then)."""
    tables: dict[str, str] | None = None
    """sha256 of every table part the run wrote (``tables/<table>/<part>.parquet`` ->
    digest), checked by every reader (:mod:`schemas.table_digests`). None in runs written
    before digests were recorded: their tables are read unverified, with a warning."""
    tables_pending: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """Parts being written (their new digest, recorded before the file is renamed into
    place) or deleted (None): a run killed midway still verifies, the part matching either
    digest or being absent."""
