"""Who runs a run: its owner process, its heartbeat, and whether that process is gone.

A run records its owner in its manifest when it starts (:class:`RunOwner`: host, pid, the
process's boot id and start time, a heartbeat time). Every manifest write by the owner
refreshes the heartbeat (:meth:`schemas.store.Run.update_manifest`), and :func:`heartbeat`
refreshes it from a thread every :data:`HEARTBEAT_S` while long stages run. A run still
marked running is *interrupted* when its owner is gone (SIGKILL, SIGTERM, power loss):

- on this host: no live process has its pid, or the one that has it started at another
  time or in another boot (the pid was reused, the machine rebooted);
- on another host (a shared or remote store): its heartbeat is older than
  :data:`STALE_S`, since its pid cannot be checked from here.

Reads show such a run as interrupted (:func:`shown_status`); the next run and
``qparity gc`` write it into the run (:mod:`pipelines.gc`, with :func:`interrupted`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from schemas.errors import QparityError
from schemas.fileio import utc_now
from schemas.manifest import Manifest, RunOwner

LOG = logging.getLogger(__name__)
HEARTBEAT_S = 30.0
"""Seconds between heartbeats of a running run."""
STALE_S = 600.0
"""A run of another host is interrupted after this many seconds without a heartbeat."""
_PROC = Path("/proc")


@cache
def _boot_id() -> str | None:
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (state first), None if there is no such file."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces


def process_token(pid: int) -> str | None:
    """``<boot id>:<start time>`` of process ``pid`` (None without Linux ``/proc``)."""
    stat, boot = _proc_stat(pid), _boot_id()
    return f"{boot}:{stat[19]}" if stat and boot else None  # field 22: starttime


def this_owner() -> RunOwner:
    """This process as a run's owner, heartbeat now."""
    pid = os.getpid()
    return RunOwner(
        host=socket.gethostname(), pid=pid, process=process_token(pid), heartbeat_at=utc_now()
    )


def is_mine(owner: RunOwner) -> bool:
    """True if ``owner`` is this process."""
    return owner.pid == os.getpid() and owner.host == socket.gethostname()


def owner_gone(owner: RunOwner, now: datetime | None = None) -> bool:
    """True if the owner process can no longer be running the run (module docstring)."""
    if owner.host != socket.gethostname():
        age = (now or datetime.now(UTC)) - datetime.fromisoformat(owner.heartbeat_at)
        return age.total_seconds() > STALE_S
    if not (_PROC / "self" / "stat").is_file():  # no /proc: the pid is all we can check
        return not _pid_exists(owner.pid)
    stat = _proc_stat(owner.pid)
    if stat is None or stat[0] in "ZXx":  # no such process, or dead and not yet reaped
        return True
    return owner.process is not None and owner.process != process_token(owner.pid)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def died(m: Manifest, now: datetime | None = None) -> bool:
    """True if ``m`` says running but its owner is gone (a run of an older version,
    without an owner, cannot be told and stays running)."""
    return m.status == "running" and m.owner is not None and owner_gone(m.owner, now)


def shown_status(m: Manifest, now: datetime | None = None) -> str:
    """The run's status as reads show it: ``interrupted`` if it :func:`died`."""
    return "interrupted" if died(m, now) else m.status


def as_shown(m: Manifest) -> Manifest:
    """``m`` as reads show it: :func:`interrupted` if it :func:`died`."""
    return interrupted(m) if died(m) else m


def interrupted(m: Manifest) -> Manifest:
    """``m`` marked interrupted: the run and every stage it was running, ended at the
    owner's last heartbeat (the last moment it is known to have been alive)."""
    end = m.owner.heartbeat_at if m.owner else utc_now()
    stages = {
        name: rec.model_copy(
            update={
                "status": "interrupted",
                "finished_at": end,
                "duration_s": max(0.0, _seconds(rec.started_at, end)),
                "error": "interrupted: the run's process died while this stage ran",
            }
        )
        if rec.status == "running"
        else rec
        for name, rec in m.stages.items()
    }
    who = f"process {m.owner.pid} on {m.owner.host}" if m.owner else "its process"
    error = (
        f"interrupted: {who} is gone (killed, or its machine stopped) since its last "
        f"heartbeat at {end[:19]}; the stages it completed are kept"
    )
    return m.model_copy(
        update={"status": "interrupted", "finished_at": end, "error": error, "stages": stages}
    )


def bare_run_row(m: Manifest) -> dict:
    """The ``runs`` row of a run killed before it wrote its own, from its manifest."""
    return {
        "run_id": m.run_id, "started_at": m.started_at, "finished_at": m.finished_at,
        "status": m.status, "spec_digest": m.spec_digest, "model": None, "march": None,
        "consistency_level": None, "settings": None, "code_version": m.code_version,
        "tags": json.dumps(m.tags, sort_keys=True),
    }  # fmt: skip


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


@contextmanager
def heartbeat(beat: Callable[[], object], every: float = HEARTBEAT_S) -> Iterator[None]:
    """Call ``beat`` every ``every`` seconds from a daemon thread while the block runs.

    A failing beat (disk full, store unreachable) is logged and retried at the next one:
    it never stops the run."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            try:
                beat()
            except (QparityError, OSError) as e:
                LOG.warning("run heartbeat failed (retried in %.0f s): %s", every, e)

    thread = threading.Thread(target=loop, name="qparity-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
