"""Sweeps: a matrix over pipeline-spec fields, expanded into runs under one sweep id.

A sweep file (YAML; paths are relative to it)::

    name: digits-levels
    spec: ../../examples/digits/spec.yaml
    matrix:                                   # the cartesian product of these lists
      quant.consistency_level: [none, 2]
      quant.march: [nash-e, nash-m]
    set: {compare.probe_samples: 2}           # fixed overrides of every run
    include:                                  # extra runs after the product
      - {quant.rounding: bpu_round}
    runner: {kind: dask, workers: 2}          # or {kind: local}; {kind: dask, address: tcp://...}

``matrix.spec`` may list spec files instead of the top-level ``spec`` (the "x model" axis).
Every run is tagged ``sweep=<sweep id>`` plus its matrix values, so the runs table groups
them. :func:`run_sweep` runs them (see :mod:`pipelines.sweep_flow`); one failing run never
stops the others.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator
from rich.table import Table

from schemas.errors import SpecError
from schemas.remote import absolute_root
from schemas.spec import PipelineSpec, load_spec, parse_spec, with_overrides
from schemas.spec_sections import Section, check_name


class LocalRunner(Section):
    """Every run in this process, one after another."""

    kind: Literal["local"] = "local"
    """Selects this runner."""


class DaskRunner(Section):
    """Runs spread over a Dask cluster through prefect-dask: one task per run."""

    kind: Literal["dask"]
    """Selects this runner."""
    address: str | None = None
    """Scheduler of a running cluster, e.g. tcp://10.0.0.5:8786."""
    workers: int | None = Field(default=None, gt=0, strict=True)
    """Start a LocalCluster of this many worker processes, one thread each."""

    @model_validator(mode="after")
    def _one_source(self) -> DaskRunner:
        if (self.address is None) == (self.workers is None):
            raise ValueError("give exactly one of address (a running cluster) or workers (N)")
        return self


class SweepFile(Section):
    """A sweep file, as read from YAML."""

    name: Annotated[str, AfterValidator(check_name)]
    """Name of the sweep; prefixes its sweep id."""
    spec: str | None = None
    """Pipeline spec of every run, relative to the sweep file (or list them in matrix.spec)."""
    matrix: dict[str, list[Any]]
    """Dotted spec field -> values; one run per combination (`spec` -> spec files)."""
    set_: dict[str, Any] = Field(default={}, alias="set")
    """Dotted spec field -> value, applied to every run before its matrix values."""
    include: list[dict[str, Any]] = []
    """Extra runs after the product, each a mapping of dotted field -> value."""
    runner: Annotated[LocalRunner | DaskRunner, Field(discriminator="kind")] = LocalRunner()
    """Where the runs execute."""

    @field_validator("matrix")
    @classmethod
    def _non_empty(cls, matrix: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not matrix:
            raise ValueError("the matrix is empty: give at least one field and its values")
        empty = [k for k, values in matrix.items() if not values]
        if empty:
            raise ValueError(f"field {empty[0]} has no values")
        return matrix

    @model_validator(mode="after")
    def _one_spec_source(self) -> SweepFile:
        if (self.spec is None) == ("spec" not in self.matrix):
            raise ValueError("give the spec file either as spec or as matrix.spec, not both")
        return self


@dataclass(frozen=True)
class Sweep:
    """A validated sweep file and where it lives (spec paths resolve against it)."""

    path: Path
    file: SweepFile

    @property
    def name(self) -> str:
        """The sweep's name."""
        return self.file.name


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file, including every run it expands to."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise SpecError("sweep file not found", where=str(path), hint="check the path") from e
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"cannot read the sweep file ({e})", where=str(path)) from e
    if not isinstance(data, dict):
        raise SpecError("a sweep file is a mapping", where=str(path), hint="give name, matrix")
    try:
        sweep = Sweep(path, SweepFile.model_validate(data))
    except ValidationError as e:
        raise _sweep_error(e, path) from e
    expand(sweep, "check")  # every combination must be a valid spec before anything runs
    return sweep


def _sweep_error(exc: ValidationError, path: Path) -> SpecError:
    lines, unknown = [], False
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "dask")))
        unknown |= err["type"] == "extra_forbidden"
        what = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{loc or '(top level)'}: {what.removeprefix('Value error, ')}")
    keys = ", ".join(f.alias or n for n, f in SweepFile.model_fields.items())
    hint = f"use: {keys}" if unknown else "correct the keys named (see pipelines/sweeps/*.yaml)"
    return SpecError("; ".join(lines), where=str(path), hint=hint)


def new_sweep_id(name: str) -> str:
    """``<name>-<UTC timestamp>-<6 hex>``, like run ids."""
    return f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def expand(sweep: Sweep, sweep_id: str | None = None) -> list[tuple[str, PipelineSpec]]:
    """(label, spec) of every run: the matrix product, then ``include``; tagged with the
    sweep id and the run's matrix values."""
    sweep_id = sweep_id or new_sweep_id(sweep.name)
    keys = list(sweep.file.matrix)
    combos = [
        dict(zip(keys, v, strict=True)) for v in itertools.product(*sweep.file.matrix.values())
    ]
    combos += [dict(extra) for extra in sweep.file.include]
    labels = _labels(combos)
    _check_distinct(sweep, labels)
    return [
        (lab, _run_spec(sweep, c, lab, sweep_id)) for lab, c in zip(labels, combos, strict=True)
    ]


def _check_distinct(sweep: Sweep, labels: list[str]) -> None:
    """SpecError for two runs with one label (a repeated matrix value, an include entry
    repeating a product run, two spec files of one name): their tags would be the same,
    so neither the UI nor the run store could tell them apart, and the sweep's record
    of one of them would be lost."""
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            raise SpecError(
                f"two runs are the same combination ({label}): their tags would be the same",
                where=str(sweep.path),
                hint="remove the repeated matrix value or include entry (spec files: "
                "give them different names)",
            )
        seen.add(label)


def _tag(value: Any) -> str:
    return str(value) if isinstance(value, str | int | float | bool) else json.dumps(value)


def _labels(combos: list[dict[str, Any]]) -> list[str]:
    """``field=value,...`` per run with short field names, full dotted names if ambiguous."""

    def label(combo: dict[str, Any], short: bool) -> str:
        parts = [
            f"{k.rsplit('.', 1)[-1] if short else k}={Path(v).stem if k == 'spec' else _tag(v)}"
            for k, v in combo.items()
        ]
        return ",".join(parts) or "base"

    labels = [label(c, True) for c in combos]
    return labels if len(set(labels)) == len(labels) else [label(c, False) for c in combos]


def _run_spec(sweep: Sweep, combo: dict[str, Any], label: str, sweep_id: str) -> PipelineSpec:
    ref = combo.get("spec", sweep.file.spec)
    try:
        base = load_spec(sweep.path.parent / str(ref))
        fields = {**sweep.file.set_, **{k: v for k, v in combo.items() if k != "spec"}}
        spec = with_overrides(base, [f"{k}={json.dumps(v)}" for k, v in fields.items()])
        tags = {**spec.tags, "sweep": sweep_id, **{k: _tag(v) for k, v in combo.items()}}
        if "spec" in combo:
            tags["spec"] = Path(str(ref)).stem
        return parse_spec({**spec.model_dump(mode="json"), "tags": tags}, "sweep")
    except SpecError as e:
        where = f"{sweep.path}: run {label}" + (f" ({e.where})" if e.where != "--set" else "")
        raise SpecError(e.what, where=where, hint=e.hint) from e


@dataclass(frozen=True)
class RunRecord:
    """What one run of a sweep gave."""

    label: str
    run_id: str | None
    status: Literal["complete", "failed"]
    value: float | None
    """The primary metric (compare.primary: top1 with labels, else cosine) of the last
    stage that ran."""
    last_stage: str | None
    first_divergent: str | None
    """First divergent stage of the run's localization (None: none, or no analysis)."""
    wall_s: float
    error: str | None = None
    where: str = ""
    """host:pid of the process that ran it (a Dask worker's, on a cluster)."""
    metric: str = "top1"
    """The name of the primary metric ``value`` is."""

    @property
    def measured(self) -> str:
        """The primary metric and the stage it was measured at, e.g. ``top1 0.9900 (board_sim)``."""
        if self.value is None:
            return f"{self.metric} -"
        return f"{self.metric} {self.value:.4f} ({self.last_stage})"

    def line(self) -> str:
        """The record as one line: label, run id, status, primary metric, first divergent."""
        top1 = self.measured
        first = f"first divergent {self.first_divergent or '-'}"
        what = self.status if self.error is None else f"{self.status}: {self.error}"
        return f"{self.label}  {self.run_id or '-'}  {what}  {top1}  {first}  {self.wall_s:.1f} s"


@dataclass
class SweepResult:
    """A finished sweep: its id, one record per run, the wall time."""

    sweep_id: str
    runner: str
    runs: list[RunRecord] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def failed(self) -> list[RunRecord]:
        """The runs that did not complete."""
        return [r for r in self.runs if r.status != "complete"]

    def table(self) -> Table:
        """The summary: one row per run."""
        table = Table(
            "run", "run_id", "status", "metric (last stage)", "first divergent", "wall_s",
            "host:pid",
            title=f"sweep {self.sweep_id} ({self.runner}, {self.wall_s:.1f} s)",
        )  # fmt: skip
        for r in self.runs:
            top1 = r.measured
            status = r.status if r.error is None else f"[red]{r.status}[/]: {r.error}"
            table.add_row(
                r.label,
                r.run_id or "-",
                status,
                top1,
                r.first_divergent or "-",
                f"{r.wall_s:.1f}",
                r.where,
            )
        return table


def run_sweep(
    sweep_path: str | Path,
    store_root: str | Path,
    use_prefect: bool = True,
    on_run: Callable[[RunRecord], None] | None = None,
) -> SweepResult:
    """Run every combination of a sweep file into ``store_root``; ``on_run`` gets each
    run's record as soon as that run ends.

    With Prefect: one flow run "qparity-sweep" named by the sweep id, one task per run, on
    the file's runner (local threads, one at a time, or Dask). Without: one after another in
    this process, whatever the runner says.
    """
    from pipelines.sweep_flow import execute_run, run_flow

    sweep = load_sweep(sweep_path)
    sweep_id = new_sweep_id(sweep.name)
    runs, root, t0 = expand(sweep, sweep_id), absolute_root(store_root), time.perf_counter()
    if use_prefect:
        records = run_flow(runs, root, sweep_id, sweep.file.runner, on_run)
        runner = _runner_name(sweep)
    else:
        records, runner = [], "no prefect"
        for label, spec in runs:
            records.append(execute_run(label, spec, str(root)))
            if on_run:
                on_run(records[-1])
    return SweepResult(sweep_id, runner, records, time.perf_counter() - t0)


def _runner_name(sweep: Sweep) -> str:
    r = sweep.file.runner
    if isinstance(r, DaskRunner):
        return f"dask {r.address}" if r.address else f"dask, {r.workers} local workers"
    return "prefect, local"
