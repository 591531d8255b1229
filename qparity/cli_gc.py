"""``qparity gc``: mark runs whose process died (SIGKILL, SIGTERM, power loss) interrupted.

Registered on the main app as ``app.command("gc")(gc_command)``. Every new run does the
same first; this command is for a store nothing runs in any more.
"""

from __future__ import annotations

from qparity.cli_options import LazyConsole, QuietOpt, RunsOpt, store_root

out = LazyConsole()


def gc_command(runs: RunsOpt = None, quiet: QuietOpt = False):
    """Mark every run still 'running' whose process is gone as interrupted (manifest,
    stages and runs tables), so `qparity runs`, `show` and SQL say so (--quiet: only the
    ids of the runs marked, one per line).

    A run is gone when its process no longer exists on this host (or its pid now belongs
    to another process), or, for a run of another host, when it sent no heartbeat for
    10 minutes. Its completed stages are kept (and reusable from the stage cache).

    Example: qparity gc --runs ./runs
    """
    from pipelines.gc import mark_interrupted
    from schemas.store import RunStore

    marked = mark_interrupted(RunStore(store_root(runs)))
    for run_id in marked:
        out.print(run_id if quiet else f"{run_id}: interrupted", highlight=False)
    if not quiet:
        out.print(
            f"{len(marked)} run{'s' * (len(marked) != 1)} marked interrupted", highlight=False
        )
