"""The metric a run is judged by (``compare.primary``) and its value at every stage.

Localization, sweeps and the report read it from the metrics table: the spec's
``compare.primary``, else top1 when the dataset had labels, else the output cosine against
the float model (stages.evaluate.primary_metric), read on the judged output (stages.outputs:
``compare.output``, else the one with top1 rows, else the first class-like one, i.e. with
top1_agreement rows, else the first). A stage pair worsens by the drop of the
metric (its rise for l1); the largest acceptable worsening is ``thresholds.top1_drop`` for
top1 and ``thresholds.primary_drop`` (null: top1_drop) for any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from schemas.errors import SpecError
from schemas.manifest import Judging, Manifest
from schemas.metric_names import LOWER_IS_BETTER, OUTPUT, primary_metric
from schemas.store import Run
from schemas.table_rows import read_run_table

if TYPE_CHECKING:
    from schemas.spec import PipelineSpec
    from schemas.spec_sections import CompareSpec


@dataclass(frozen=True)
class Primary:
    """The primary metric's name, its value per stage, and the worsening allowed."""

    name: str
    values: dict[str, float]
    limit: float
    samples: dict[str, int] = field(default_factory=dict)
    """How many samples each stage's value was measured on."""
    output: str = OUTPUT
    """The output id the values were read on (a task metric's rows have none)."""

    @property
    def label(self) -> str:
        return "top-1" if self.name == "top1" else self.name

    def worsening(self, base: str, analysis: str) -> float:
        """How much worse ``analysis`` is than ``base`` (NaN when either was not measured)."""
        a, b = self.values.get(base, math.nan), self.values.get(analysis, math.nan)
        return b - a if self.name in LOWER_IS_BETTER else a - b

    def reason(self, base: str, analysis: str) -> str | None:
        """Why the pair diverges by this metric, or None when it stays within the limit."""
        worse = self.worsening(base, analysis)
        if not worse > self.limit:
            return None
        verb = "rises" if self.name in LOWER_IS_BETTER else "drops"
        on = "" if self.output == OUTPUT else f" on {self.output}"
        return f"{self.label}{on} {verb} {worse:.4f} (> {self.limit})"


def read_primary(spec: PipelineSpec, rows: list[dict]) -> Primary:
    """The primary metric of a run from its metrics rows by ``spec``'s ``compare`` section
    (anything with one: a PTQ run's analysis passes the defaults)."""
    return judged_primary(spec.compare.as_judging(), rows)


def judged_primary(judging: Judging, rows: list[dict]) -> Primary:
    """The primary metric of a run from its metrics rows (one output: ``output``; rows
    written before outputs were recorded carry none), judged by ``judging``."""
    name = primary_metric(judging.primary, {r["metric"] for r in rows})
    output = judged_row_output(judging.output, rows)
    mine = [r for r in rows if r["metric"] == name and r.get("output") in (None, output)]
    primary_drop = judging.primary_drop
    limit = judging.top1_drop if name == "top1" or primary_drop is None else primary_drop
    samples = {r["stage"]: r.get("n_samples") for r in mine}
    return Primary(name, {r["stage"]: r["value"] for r in mine}, limit, samples, output)


def judged_row_output(named: str | None, rows: list[dict]) -> str:
    """The judged output of a run's metrics rows (module docstring; rows written before
    outputs were recorded: ``output``)."""
    outputs = [r["output"] for r in rows if r.get("output")]
    for metric in ("top1", "top1_agreement"):
        hit = next((r["output"] for r in rows if r["metric"] == metric and r.get("output")), None)
        if named is None and hit is not None:
            return hit
    return named or (outputs[0] if outputs else OUTPUT)


def run_primary(
    run: Run,
    compare: CompareSpec | None = None,
    metrics: list[dict] | None = None,
    manifest: Manifest | None = None,
) -> Primary:
    """The primary metric of a stored run, by ``compare`` (a PTQ run's: its spec's
    ``judging()``) or what the run records (:func:`stored_judging`); ``metrics`` and
    ``manifest``: the run's metrics rows and manifest, if the caller read them already."""
    judging = compare.as_judging() if compare is not None else stored_judging(run, manifest)
    return judged_primary(judging, read_run_table(run, "metrics") if metrics is None else metrics)


def stored_judging(run: Run, manifest: Manifest | None = None) -> Judging:
    """What ``run`` is judged by: its manifest's ``judging``, recorded when it started;
    for a run from before that, its spec.yaml's ``compare`` (a spec the current code
    refuses: the defaults). Only then are the spec's models imported."""
    recorded = (manifest or run.manifest()).judging
    if recorded is not None:
        return recorded
    from schemas.spec import load_spec
    from schemas.spec_sections import CompareSpec

    try:
        return load_spec(run.path("spec.yaml")).compare.as_judging()
    except SpecError:
        return CompareSpec().as_judging()
