"""The judged output of every stage model on every evaluation sample, as the chain stored it.

Each stage wrote its model's outputs on the whole evaluation split to ``stage_outputs``
while it measured its metrics (:func:`stages.evaluate.record_outputs`). The analysis
compares stage pairs' outputs on every sample from there (bad cases are picked among all
of them) and runs the models, with every layer captured, on ``compare.samples`` only.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from schemas.tables import read_run_arrow
from stages.outputs import judged_output


def stored_outputs(ctx, stages: list[str]) -> dict[str, np.ndarray] | None:
    """Stage -> its judged output on every evaluation sample (in sample order, the float
    model's shape), or None when any stage has none stored: a stage served from the cache
    or run before the table existed, the PTQ chain, outputs past the size limit. Then the
    analysis compares outputs on the samples it runs the models on, as before."""
    data = read_run_arrow(ctx.run, "stage_outputs")
    if data is None:
        return None
    labelled = ctx.evaluation.labels is not None
    oid = judged_output(ctx.reference, ctx.spec.compare.output, labelled)
    shape = np.shape(ctx.reference[oid])
    got = {}
    for stage in stages:
        rows = data.filter(
            pc.and_(pc.equal(data["stage"], stage), pc.equal(data["output_id"], oid))
        )
        values = _in_order(rows, shape)
        if values is None:
            return None
        got[stage] = values
    return got


def _in_order(rows, shape: tuple[int, ...]) -> np.ndarray | None:
    """The rows' values as one array of ``shape`` ordered by sample id, or None unless
    they are exactly samples ``0 .. shape[0] - 1`` of that shape."""
    ids = rows["sample_id"].to_numpy()
    order = np.argsort(ids, kind="stable")
    flat = rows["values"].combine_chunks().flatten().to_numpy()
    if not np.array_equal(ids[order], np.arange(shape[0])) or flat.size != np.prod(shape):
        return None
    return flat.reshape(shape)[order]
