"""What changed between two runs (``qparity diff RUN_A RUN_B``), and its console view.

:func:`diff_runs` runs the ``run_diff_*`` named queries on one view of the store and
returns one Arrow table per section; :func:`render_diff` turns them into rich tables
(only the rows that changed, unless asked for all).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml
from rich.console import Group
from rich.text import Text

from analysis.query import connect, load_query, named
from analysis.rich_tables import rich_table
from schemas.errors import QueryError, SpecError
from schemas.spec import load_spec
from schemas.store import RunStore
from schemas.store_layout import run_folders
from schemas.table_digests import check_table
from schemas.table_schemas import SCHEMAS

SECTIONS = {
    "run": "run_diff_run",
    "stages": "run_diff_stages",
    "metrics": "run_diff_metrics",
    "localization": "run_diff_localization",
}
"""Section name -> the named query that answers it."""

_TITLES = {
    "run": "Recipe: fields, settings, tags and spec fields that differ",
    "stages": "Stages: artifacts that differ (same digest = same artifact) and cache hits",
    "metrics": "Metrics: b - a per stage",
    "localization": "Localization: findings that differ",
}


def diff_runs(root: str | Path, a: str, b: str) -> dict[str, pa.Table]:
    """Differences between runs ``a`` and ``b`` of the store ``root``, by section.

    Sections (see :data:`SECTIONS`): ``run`` (only differing fields and settings/tags
    keys), ``stages`` (every stage, with ``same_artifact``), ``metrics`` (every stage
    metric, with ``delta`` and ``changed``), ``localization`` (paired findings, with
    ``changed``). :class:`QueryError` if either run has no row in the runs table;
    :class:`~schemas.errors.ArtifactError` naming the file if a part of their tables was
    changed after the run wrote it (SQL would only leave it out).
    """
    _verify_runs(root, (a, b))
    queries = ("runs_by_id", *SECTIONS.values())  # only the two runs, only these tables
    con = connect(root, "\n".join(load_query(q).sql for q in queries), runs=(a, b))
    try:
        found = set(named(con, "runs_by_id", ids=[a, b]).column("run_id").to_pylist())
        missing = [r for r in (a, b) if r not in found]
        if missing:
            raise QueryError(
                f"no run {', '.join(map(repr, missing))} in the runs table",
                where=str(root),
                hint="`qparity runs` lists runs; a run still running has no row yet",
            )
        specs = _comparable_specs(spec_json(root, a), spec_json(root, b))
        return {
            section: named(con, query, a=a, b=b, **(specs if section == "run" else {}))
            for section, query in SECTIONS.items()
        }
    finally:
        con.close()


def spec_json(root: str | Path, run_id: str) -> str | None:
    """The run's spec.yaml as JSON text for the ``spec`` rows of the run section: validated
    (defaults filled in, so a spec that spells out a default equals one that omits it),
    else as written (e.g. a PTQ spec); without ``tags``, which have their own section.
    None when the run has no readable spec file."""
    path = RunStore(root).open(run_id).path("spec.yaml")
    try:
        data = load_spec(path).model_dump(mode="json")
    except SpecError:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None
    if not isinstance(data, dict):
        return None
    data.pop("tags", None)
    return json.dumps(data, sort_keys=True, default=str)


def _comparable_specs(a: str | None, b: str | None) -> dict[str, str | None]:
    """The spec parameters of ``run_diff_run``: both specs, or when either run's spec.yaml
    is missing or unreadable, one ``file`` leaf per side saying which (the other side's
    fields alone would show every field as a difference, with no word of why)."""
    if a is not None and b is not None:
        return {"a_spec": a, "b_spec": b}
    state = {True: "read", False: "spec.yaml missing or unreadable"}
    return {
        k: json.dumps({"file": state[s is not None]}) for k, s in (("a_spec", a), ("b_spec", b))
    }


def _verify_runs(root: str | Path, run_ids: tuple[str, ...]) -> None:
    """Check every table part of the named runs that exist (a missing run: QueryError later)."""
    store = RunStore(root)
    folders = {p.name: p for p in run_folders(store.local_copy())}
    for rid in run_ids:
        if rid in folders:
            for table in SCHEMAS:
                check_table(folders[rid], table)


def changed_rows(section: str, table: pa.Table) -> pa.Table:
    """The rows of a diff section that show a difference."""
    if section == "run" or table.num_rows == 0:
        return table
    if section == "stages":
        differs = pc.or_kleene(
            pc.invert(table.column("same_artifact")),
            pc.not_equal(table.column("a_cache_hit"), table.column("b_cache_hit")),
        )
        return table.filter(pc.fill_null(differs, True))
    return table.filter(pc.fill_null(table.column("changed"), True))


def render_diff(diff: dict[str, pa.Table], a: str, b: str, show_all: bool = False) -> Group:
    """The diff as rich tables, one per section, with a = ``a`` and b = ``b``."""
    parts: list[Any] = [Text(f"a = {a}\nb = {b}")]
    for section, table in diff.items():
        shown = table if show_all else changed_rows(section, table)
        title = _TITLES.get(section, section)
        if shown.num_rows == 0:
            parts.append(Text(f"{title}: no difference", style="green"))
        else:
            parts.append(rich_table(shown, title=title))
    return Group(*parts)
