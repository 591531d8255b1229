"""``qparity edit RUN --remove-fake-quant 1-100,102``: the vendor's bc_editor, on qat.onnx.

Numbers are node indices of debug/qat_onnx.txt. For a QuantizeLinear or DequantizeLinear
the fake-quant pair it belongs to is removed; for a compute node, the pairs on its weights
and on its output. Removing a pair rewires its consumers to the float value it quantized,
so that op runs in float: in the edited qat.onnx and, after reconverting, as a float
island of the integer graph. Consistency of a model = agreement of its integer graph with
its qat.onnx on the evaluation samples (output L1 and cosine); each fallback (each number
alone, then all together) is ranked by how much it improves on the unedited pair. A
number with no pair of its own (a Relu, a table op and its integer Q/DQ) is kept, and
:func:`why_kept` says why and what to number instead.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import onnx

from analysis.verify import cosine
from schemas.errors import SpecError
from schemas.fileio import sha256_bytes

QDQ = ("QuantizeLinear", "DequantizeLinear")


def parse_numbers(text: str, count: int) -> list[int]:
    """``"1-100,102"`` -> [1, ..., 100, 102]; each within 0..count-1, at least one."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SpecError(
                f"{part!r} is not a number or a range",
                where="--remove-fake-quant",
                hint="use node numbers of debug/qat_onnx.txt, e.g. 1-100,102",
            )
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo or hi >= count:
            raise SpecError(
                f"{part} is outside the graph's nodes 0-{count - 1}",
                where="--remove-fake-quant",
                hint="see debug/qat_onnx.txt for the numbers",
            )
        out.extend(range(lo, hi + 1))
    if not out:
        raise SpecError(
            f"no node number in {text!r}",
            where="--remove-fake-quant",
            hint="give node numbers of debug/qat_onnx.txt, e.g. 1-100,102",
        )
    return sorted(set(out))


def pairs_of(model: onnx.ModelProto, k: int) -> list[tuple[int, int]]:
    """The (Quantize, Dequantize) node index pairs node ``k`` stands for."""
    nodes, (producer, users) = model.graph.node, _links(model)
    node = nodes[k]
    if node.op_type == "QuantizeLinear":
        return [(k, d) for d in users.get(node.output[0], []) if nodes[d].op_type == QDQ[1]]
    if node.op_type == "DequantizeLinear":
        q = producer.get(node.input[0])
        return [(q, k)] if q is not None and nodes[q].op_type == QDQ[0] else []
    out = []
    for name in node.input[1:]:  # weights: DQ(Q(initializer)), transposed for a MatMul
        d = producer.get(name)
        if d is not None and nodes[d].op_type == "Transpose":
            d = producer.get(nodes[d].input[0])
        if d is not None and nodes[d].op_type == QDQ[1]:
            out += pairs_of(model, d)
    for q in users.get(_biased(model, node, users), []):
        if nodes[q].op_type == QDQ[0]:
            out += pairs_of(model, q)
    return out


def _links(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, list[int]]]:
    """(tensor -> index of its producer, tensor -> indices of its users)."""
    producer = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    users: dict[str, list[int]] = {}
    for i, n in enumerate(model.graph.node):
        for name in n.input:
            users.setdefault(name, []).append(i)
    return producer, users


def _biased(model: onnx.ModelProto, node: onnx.NodeProto, users: dict) -> str:
    """The node's output, or for a MatMul whose one user adds a constant bias (a linear
    layer on a 3-D input), that Add's output: where the layer's output quantizer sits."""
    after = users.get(node.output[0], [])
    if node.op_type != "MatMul" or len(after) != 1:
        return node.output[0]
    add = model.graph.node[after[0]]
    consts = {i.name for i in model.graph.initializer}
    return add.output[0] if add.op_type == "Add" and add.input[1] in consts else node.output[0]


def remove_fake_quant(model: onnx.ModelProto, numbers: list[int]) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` without the fake-quant pairs of ``numbers``; how many went."""
    pairs = {p for k in numbers for p in pairs_of(model, k)}
    edited = copy.deepcopy(model)
    nodes = edited.graph.node
    rename = {nodes[d].output[0]: nodes[q].input[0] for q, d in pairs}
    for n in nodes:
        for i, name in enumerate(n.input):
            n.input[i] = rename.get(name, name)
    for out in edited.graph.output:
        if out.name in rename:  # keep the graph's output name: an Identity from the float value
            nodes.append(onnx.helper.make_node("Identity", [rename[out.name]], [out.name]))
    drop = sorted({i for p in pairs for i in p}, reverse=True)
    for i in drop:
        del nodes[i]
    made = {o for n in nodes for o in n.output}
    kept = [v for v in edited.graph.value_info if v.name in made]  # the removed Q's types go
    del edited.graph.value_info[:]
    edited.graph.value_info.extend(kept)
    return edited, len(pairs)


def why_kept(model: onnx.ModelProto, k: int) -> str:
    """Why node ``k`` has no fake-quant pair to remove, and what to number instead."""
    node = model.graph.node[k]
    what = f"node {k} ({node.op_type} {node.name})"
    if node.domain or node.op_type in QDQ:
        return (
            f"{what} is a table op or its integer input/output: the table computes on "
            "integers in qat.onnx too, so it has no float form to fall back to"
        )
    src = _upstream_pair(model, k)
    instead = f"number node {src} to run it on floats" if src is not None else "nothing to do"
    return f"{what} has no fake quant of its own (it runs on its input's integers): {instead}"


def _upstream_pair(model: onnx.ModelProto, k: int) -> int | None:
    """The nearest node up node ``k``'s first-input chain that has a pair to remove."""
    producer, _ = _links(model)
    node = model.graph.node[k]
    while node.input and (src := producer.get(node.input[0])) is not None:
        if pairs_of(model, src):
            return src
        node = model.graph.node[src]
    return None


def edit_name(numbers: list[int]) -> str:
    """A file-safe name of a set of node numbers: ``[1, 2, 3, 7]`` -> ``"1-3_7"``."""
    runs: list[list[int]] = []
    for k in numbers:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    name = "_".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return name if len(name) <= 80 else f"{name[:60]}_{sha256_bytes(name.encode())[:12]}"


def agreement(qat_out: np.ndarray, int_out: np.ndarray) -> dict[str, float]:
    """Output L1 and cosine of an integer graph against its qat.onnx."""
    a, b = np.asarray(qat_out, np.float64), np.asarray(int_out, np.float64)
    return {"l1": float(np.mean(np.abs(a - b))), "cosine": cosine(a, b)}
