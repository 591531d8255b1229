"""How the PTQ stages feed a graph and name its outputs (the QAT chain's contract, #11).

Inputs: every graph input is fed by name from the split's inputs (stages.data ``Split.inputs``);
the graph's input names and the dataset's must be the same set, else a StageError names
the file, both lists and the fix. An integer input (token ids) is carried to the .hbm as the
indices of an embedding: a Gather of a constant table, whose table calibrated quantizes like
a weight (per tensor), so the lookup reads integers; it gets no input quantizer (calibration
observes float tensors only). Any other integer input (an int64 mask cast to float and
computed on) is refused at ``original``, naming it and its reader
(:func:`refuse_integer_inputs`).

Outputs: a graph's outputs in graph order get the canonical ids of stages.outputs: one
output is ``output``; several are ``output.<name>`` by their ONNX names when every name
is a word (``output.boxes``, ``output.scores``), else ``output.0``, ``output.1``...
Every output gets its stage metrics; ``compare.output`` names the judged one.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import onnx

from schemas.errors import StageError
from schemas.metric_names import OUTPUT
from stages.data import Split
from stages.outputs import judged_output

FLOAT = onnx.TensorProto.FLOAT


def graph_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph's fed inputs in order (initializers listed as inputs left out)."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def align_one_input(split: Split, graph: list[str]) -> Split:
    """A graph of one input reads a dataset of one input whatever its name: the (x, y) form
    names it ``x``, a forward's parameter may be ``input`` (torchvision's LRASPP) while the
    exporter wrote ``x``. Any other split is returned as it is."""
    if len(graph) != 1 or len(split.inputs) != 1 or graph[0] in split.inputs:
        return split
    return replace(split, inputs={graph[0]: next(iter(split.inputs.values()))})


def align_splits(splits: dict[str, Split], path) -> dict[str, Split]:
    """:func:`align_one_input` on every split, for the ONNX file at ``path`` (unreadable:
    unchanged; ``original`` reports the file)."""
    try:
        graph = graph_inputs(onnx.load(str(path), load_external_data=False))
    except Exception:  # onnx raises many types; original names the file's problem
        return splits
    return {k: align_one_input(v, graph) for k, v in splits.items()}


def check_inputs(model: onnx.ModelProto, split: Split, where: str) -> None:
    """The graph's inputs and the split's must be the same names (any order)."""
    graph, data = graph_inputs(model), list(split.inputs)
    if set(graph) != set(data):
        raise StageError(
            f"the model's inputs {graph} are not the dataset's inputs {data} (split {split.name})",
            where=where,
            hint="name the dataset's inputs after the graph's ({\"inputs\": {name: array}}; "
            "the (x, y) form names its one input 'x')",
        )


def refuse_integer_inputs(model: onnx.ModelProto, where: str) -> None:
    """A graph input that is not float32 and is read other than as the indices of an
    embedding (a Gather of a constant table) is refused, naming it and that reader."""
    inits = {i.name for i in model.graph.initializer}
    for i in model.graph.input:
        elem = i.type.tensor_type.elem_type
        if i.name in inits or elem == FLOAT:
            continue
        bad = next((n for n in model.graph.node if i.name in n.input
                    and not _embedding_index(n, i.name, inits)), None)  # fmt: skip
        if bad is not None:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "unknown"
            raise StageError(
                f"input {i.name!r} is {dtype} and read by {bad.op_type} {bad.name!r}: the PTQ "
                "chain carries an integer input only as the indices of an embedding (a "
                "Gather of a constant table); calibration observes float tensors only",
                where=f"{where} / input {i.name}",
                hint="export the model from the first float tensor on (e.g. an attention "
                "mask as BERT's additive float mask, examples/onnx_zoo bert_ids)",
            )


def _embedding_index(node: onnx.NodeProto, name: str, inits: set[str]) -> bool:
    """``node`` reads ``name`` only as the indices of a Gather of a constant table."""
    return (node.op_type == "Gather" and node.input[0] in inits
            and list(node.input[1:]) == [name])  # fmt: skip


def take(inputs: dict[str, np.ndarray], sl) -> dict[str, np.ndarray]:
    """Every input's samples ``sl`` (a slice or indices), by name."""
    return {k: np.ascontiguousarray(v[sl]) for k, v in inputs.items()}


def ordered(names, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """The inputs in the order ``names`` lists them (a program's or a graph's)."""
    return tuple(inputs[n] for n in names)


def output_ids(model: onnx.ModelProto) -> list[str]:
    """The canonical ids of the graph's outputs, in graph order (module docstring)."""
    names = [o.name for o in model.graph.output]
    if len(names) == 1:
        return [OUTPUT]
    words = all(re.fullmatch(r"\w+", n) for n in names) and len(set(names)) == len(names)
    return [f"{OUTPUT}.{n if words else k}" for k, n in enumerate(names)]


def judged_index(model: onnx.ModelProto, named: str | None, labelled: bool) -> int:
    """The position of the judged output among the graph's outputs (stages.outputs'
    rule, read from the outputs' ranks: ``compare.output``, else the first (N, C) one)."""
    ranks = [len(o.type.tensor_type.shape.dim) for o in model.graph.output]
    ids = output_ids(model)
    shapes = {oid: np.empty((0,) * r) for oid, r in zip(ids, ranks, strict=True)}
    return ids.index(judged_output(shapes, named, labelled))
