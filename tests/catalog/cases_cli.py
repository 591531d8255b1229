"""Bad command-line inputs for the catalog (tests/catalog/test_bad_inputs.py): a run store
that is a file, a symlinked run folder, SQL that writes through a PIVOT or runs too long.

Every case works in the scratch folder or reads the complete run: it is never changed.
"""

from __future__ import annotations

from schemas.errors import ArtifactError, QueryError
from schemas.store import RunStore

LONG = "SELECT count(*) FROM range(100000) a, range(100000) b, range(100000) c"


def _file_as_store(env):
    path = env.tmp / "not-a-store.txt"
    path.write_text("x")
    return RunStore(path).list_runs()


def _linked_run(env):
    store = RunStore(env.tmp / "linked-store")
    store.root.mkdir(exist_ok=True)
    link = store.root / env.run_id
    if not link.is_symlink():
        link.symlink_to(env.run.root, target_is_directory=True)
    return store.open(env.run_id)


def _sql(env, query: str, **kwargs):
    from analysis.query import run_sql

    return run_sql(env.root, query, **kwargs)


def cases() -> dict:
    return {
        "run store is a file": (_file_as_store, ArtifactError, "not-a-store.txt"),
        "symlinked run folder": (_linked_run, ArtifactError, "linked-store"),
        "sql pivot into a table": (lambda e: _sql(e, "CREATE TABLE t AS PIVOT runs ON status"),
                                   QueryError, "CREATE"),
        "sql past its time limit": (lambda e: _sql(e, LONG, timeout_s=0.2), QueryError,
                                    "time limit of 0.2 s"),
    }  # fmt: skip
