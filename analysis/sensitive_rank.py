"""The sizes sensitive ops are ranked by when a pair cannot be re-run layer by layer.

Own errors are compared in int8 steps (an int32 accumulator's: in 1/127 of its range), so
layers of different dtypes rank together. When only total errors are known (a simulator
pair: ``OwnErrors.exact`` False), a total error carries everything upstream and grows
downstream (a fan-in sums the errors it reads), so:

- a layer where the error enters (off past the tolerance, no layer upstream of it off) is
  credited the largest total error at or downstream of it: reverting it alone would also
  remove everything it causes further on;
- any other layer keeps only what it adds to the largest error upstream of it, which may
  still be growth of an inherited error, so it ranks after the entry that caused it.
"""

from __future__ import annotations

from collections.abc import Iterable

from analysis.compare import PairResult
from analysis.layer_graph import Layer
from analysis.own_error import OwnErrors
from analysis.tolerance import factor, span_of


def in_int8_steps(
    result: PairResult,
    own: OwnErrors,
    dtypes: dict[str, str],
    layers: dict[str, Layer],
    over: Iterable[str] = (),
) -> dict[str, float]:
    """Each layer's own error in int8 steps, or with total errors only, its estimated
    share (module docstring); ``over``: the layers off past the pair's tolerance."""
    size = {
        lid: steps / factor(dtypes.get(lid), span_of(result.aggregates[lid], result.steps[lid]))
        for lid, steps in own.steps.items()
    }
    if own.exact:
        return size
    share = {lid: max(s - _upstream(lid, size, layers), 0.0) for lid, s in size.items()}
    off, consumers = set(over), _consumers(layers)
    for lid in off & set(size):
        if not _reach(lid, _producers(layers)) & off:  # the error enters here
            share[lid] = max(size[d] for d in ({lid} | _reach(lid, consumers)) & set(size))
    return share


def _upstream(lid: str, size: dict[str, float], layers: dict[str, Layer]) -> float:
    """The largest ``size`` among the nearest layers upstream of ``lid`` that have one
    (a layer the stage does not capture, e.g. a conv fused with its relu, is passed
    through to its own producers)."""
    found, todo, seen = 0.0, list(layers[lid].producers) if lid in layers else [], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if p in size:
            found = max(found, size[p])
        elif p in layers:
            todo += layers[p].producers
    return found


def _producers(layers: dict[str, Layer]) -> dict[str, tuple[str, ...]]:
    return {lid: layer.producers for lid, layer in layers.items()}


def _consumers(layers: dict[str, Layer]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for lid, layer in layers.items():
        for p in layer.producers:
            out.setdefault(p, []).append(lid)
    return out


def _reach(lid: str, edges: dict) -> set[str]:
    """Every node reachable from ``lid`` along ``edges`` (``lid`` itself excluded)."""
    seen, todo = set(), list(edges.get(lid, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += edges.get(n, ())
    return seen
