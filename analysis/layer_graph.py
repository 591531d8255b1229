"""The layers of a run's model in topological order, with their op types and producers.

Read from prepare's ``artifacts/prepare/layers.json`` (one record per graph node: node
name, canonical layer id, op type, input node names, topo index, the layer a node was
merged into). Merged nodes (a BatchNorm folded into its conv) are not layers of their own.
The model input is the layer ``input:<name>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ArtifactError
from schemas.fileio import parse_json
from schemas.store import Run


@dataclass(frozen=True)
class Layer:
    """One layer: its id, op type, position and the layers it reads."""

    layer_id: str
    op_type: str
    topo_index: int
    producers: tuple[str, ...]


def load_layers(run: Run, inputs: tuple[str, ...] = ("x",)) -> dict[str, Layer]:
    """Layer id -> :class:`Layer`, in topological order; ``inputs``: the model input names."""
    records = _records(run.path("artifacts/prepare/layers.json"))
    owner = {r["node"]: r["merged_into"] or r["layer_id"] for r in records}
    layers: dict[str, Layer] = {}
    for r in sorted(records, key=lambda r: r["topo_index"]):
        if r["merged_into"]:
            continue
        producers = []
        for name in r["inputs"]:
            src = owner.get(name) or (f"input:{name}" if name in inputs else None)
            if src and src != r["layer_id"] and src not in producers:
                producers.append(src)
        layers[r["layer_id"]] = Layer(
            r["layer_id"], r["op_type"], r["topo_index"], tuple(producers)
        )
    return layers


_KEYS = {"node", "layer_id", "op_type", "inputs", "topo_index", "merged_into"}


def _records(path) -> list[dict]:
    """The records of layers.json; ArtifactError if it is unreadable or not a list of
    records with every key the graph needs (a truncated or foreign file)."""
    try:
        records = parse_json(path.read_text())
        if not isinstance(records, list) or not all(
            isinstance(r, dict) and r.keys() >= _KEYS for r in records
        ):
            raise ValueError(f"expected a list of records with keys {', '.join(sorted(_KEYS))}")
    except (OSError, ValueError) as e:
        raise ArtifactError(
            f"cannot read the layer table ({e})", where=str(path), hint="rerun prepare"
        ) from e
    return records


def ordered(layers: dict[str, Layer], ids) -> list[str]:
    """``ids`` in topological order (unknown ids, e.g. ``input:x``, first)."""
    return sorted(ids, key=lambda i: (layers[i].topo_index if i in layers else -1, i))
