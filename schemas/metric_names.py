"""Names of the stage metrics that readers share without importing torch.

``OUTPUT`` is the id of a model's single output; ``LOWER_IS_BETTER`` the metrics where a
drop is an improvement; :func:`primary_metric` which metric a run is judged by.
"""

from __future__ import annotations

from schemas.errors import SpecError

OUTPUT = "output"
"""The output id of a model returning one tensor."""
LOWER_IS_BETTER = frozenset({"l1"})
"""Metrics where a smaller value is better (an error, not an agreement)."""


def primary_metric(named: str | None, recorded: set[str]) -> str:
    """The metric judged by localization, sweeps, ``show`` and the report: ``named``
    (compare.primary), else top1 when recorded (labels), else cosine."""
    primary = named or ("top1" if "top1" in recorded else "cosine")
    if recorded and primary not in recorded:
        raise SpecError(
            f"compare.primary: {primary!r} is not among the metrics the run records "
            f"({', '.join(sorted(recorded))})",
            where="compare.primary",
            hint="name one of those (top1 needs labels in the dataset)",
        )
    return primary
