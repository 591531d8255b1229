"""The batch of a PTQ model, and the proof that ``original`` computes what the file does.

:func:`dynamic_batch` is what ``original`` does to the checked file: size computations
folded, targets that follow the batch rewritten (:mod:`stages.ptq.shapes`); a batch fixed
by the file (``[1, 3, H, W]``) made dynamic (:mod:`stages.ptq.generalize`); a dynamic
batch whose size computations do not fold fixed at ``model.input_shapes``' dim 0 first,
then made dynamic the same way. The batch is dim 0 of every input: the inputs that fix it
(and the dims ``model.input_shapes`` gives) must agree, else a StageError names them and
their dims; inputs left dynamic take it. :func:`prove_same` runs the file as given (in chunks of
its fixed batch, if it has one) and the rewritten model (all frames at once) on the first
evaluation frames: every output must agree, else a StageError naming the output.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

from schemas.errors import StageError
from stages.onnx_runner import OnnxRunner
from stages.ptq import shapes
from stages.ptq.generalize import generalize
from stages.ptq.original import unsupported

FIELD = "model.input_shapes"
RTOL = 1e-5
"""Outputs agree within ``RTOL * max |source|`` (batched kernels may sum in another order);
a wrong rewrite mixes frames or drops them, far beyond this."""


def fixed_batch(model: onnx.ModelProto) -> int | None:
    """The batch the model's inputs fix (dim 0 a number: the inputs fixing it must agree;
    inputs left dynamic take it), or None (all dynamic)."""
    dims = {i.name: [d.dim_value or d.dim_param or "?" for d in i.type.tensor_type.shape.dim]
            for i in _fed(model)}  # fmt: skip
    return agreed_batch(dims, "the model's inputs fix")


def agreed_batch(dims: dict[str, list], what: str) -> int | None:
    """The one batch (dim 0) that the inputs' ``dims`` giving a number there agree on, or
    None; inputs giving different ones are a StageError naming them and their dims."""
    fixed = {k: v for k, v in dims.items() if v and isinstance(v[0], int) and v[0] > 0}
    if len({v[0] for v in fixed.values()}) > 1:
        listed = ", ".join(f"{k} {v}" for k, v in fixed.items())
        raise StageError(
            f"original: {what} different batches (dim 0): {listed}",
            where=f"{FIELD} / inputs {', '.join(fixed)}",
            hint="dim 0 of every input is the batch: export the inputs with one batch (or "
            f"a dynamic one); {FIELD} sets the other dims",
        )
    return next(iter(fixed.values()))[0] if fixed else None


def _fed(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are fed (initializers listed as inputs left out)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


class Batched(NamedTuple):
    """What :func:`dynamic_batch` made: the model, the folding, the batch it was fixed at
    (None: dynamic in the file and kept so) and the generalizing rewrites."""

    model: onnx.ModelProto
    folded: shapes.Folded
    fixed: int | None
    rewrites: list[str]


def dynamic_batch(source: onnx.ModelProto, input_shapes: dict) -> Batched:
    """``source`` (checked, input shapes fixed) folded, with a dynamic batch (every input's dim 0)."""
    fixed = fixed_batch(source)
    if fixed is not None and _dynamic_inputs(source):  # they take the batch the others fix
        source = _with_fixed_batch(source, fixed)
    folded = shapes.fold_shapes(source, fixed)
    named = {i.name: input_shapes[i.name] for i in _fed(source) if i.name in input_shapes}
    given = agreed_batch(named, f"{FIELD} gives")
    if fixed is None and given and any(n.op_type == "Shape" for n in unsupported(folded.model)):
        fixed = given
        folded = shapes.fold_shapes(_with_fixed_batch(source, given), given)
        _refuse_left_shapes(folded.model, given)
    if fixed is None:
        return Batched(folded.model, folded, None, [])
    model, rewrites = generalize(folded.model, fixed)
    return Batched(model, folded, fixed, rewrites)


def _refuse_left_shapes(model: onnx.ModelProto, b: int) -> None:
    """``Shape`` nodes that do not fold even at batch ``b`` read tensors whose shapes
    shape inference cannot give (a channel split computed from a Shape, as TorchScript
    writes ``chunk``): the batch walk cannot follow them."""
    left = [n.name for n in unsupported(model) if n.op_type == "Shape"]
    if left:
        raise StageError(
            f"original: {len(left)} Shape node(s) do not fold even with the batch fixed at "
            f"{b}: {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}",
            where=f"{FIELD} / node {left[0]}",
            hint="their input's shape is computed at run time: export the model with a "
            "fixed input shape (batch 1) or with torch's dynamo exporter, whose files fold",
        )


def _dynamic_inputs(model: onnx.ModelProto) -> list[str]:
    """The fed inputs whose dim 0 is not a number."""
    return [i.name for i in _fed(model)
            if (d := i.type.tensor_type.shape.dim) and not d[0].dim_value]  # fmt: skip


def _with_fixed_batch(model: onnx.ModelProto, b: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for dims in (i.type.tensor_type.shape.dim for i in _fed(out)):
        if dims:  # a scalar input has no batch
            dims[0].Clear()
            dims[0].dim_value = b
    del out.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(out, data_prop=True)


def render(batched: Batched, diff: float | None, frames: int) -> list[str]:
    """The model_check_result.txt section on the batch."""
    how = ("dynamic in the file" if batched.fixed is None and not batched.rewrites
           else f"fixed at {batched.fixed}, made dynamic ({len(batched.rewrites)} rewrites)")  # fmt: skip
    lines = ["", "## batch", f"batch: {how}", *batched.rewrites]
    if diff is not None:
        lines.append(f"the rewritten model equals the file on {frames} frames (max relative "
                     f"difference {diff:.2g})")  # fmt: skip
    return lines


def prove_same(
    source: onnx.ModelProto, model: onnx.ModelProto, x: dict | np.ndarray, batch: int | None
) -> float:
    """Run ``source`` (chunks of ``batch``, or all of ``x``) and ``model`` (all of ``x``;
    every input by name); the largest output difference relative to the source's magnitude."""
    x = x if isinstance(x, dict) else {source.graph.input[0].name: x}
    n = len(next(iter(x.values())))
    if batch:
        n = n // batch * batch
        x = {k: v[:n] for k, v in x.items()}
        if not n:
            raise StageError(
                f"original: the model fixes the batch at {batch}, the evaluation split has "
                "fewer frames",
                where="data.evaluation_samples",
                hint=f"evaluate on at least {batch} frames (the file runs on {batch} at a time)",
            )
    chunks = [{k: v[a : a + batch] for k, v in x.items()} for a in range(0, n, batch)] \
        if batch else [x]  # fmt: skip
    runner = OnnxRunner(source)
    want = [np.concatenate(o) for o in zip(*(runner.run(c) for c in chunks), strict=True)]
    got = OnnxRunner(model).run(x)
    worst = 0.0
    for name, w, g in zip(runner.output_names, want, got, strict=True):
        scale = max(float(np.abs(w).max()), 1e-12)
        diff = np.inf if w.shape != g.shape else float(np.abs(w - g).max()) / scale
        if diff > RTOL:
            raise StageError(
                f"original: the rewritten model's output {name!r} differs from the model "
                f"file's on {n} frames (shape {list(g.shape)} vs {list(w.shape)}, "
                f"max relative difference {diff:.3g})",
                where=f"{FIELD} / output {name}",
                hint="see debug/model_check_result.txt for the rewrites; export the model "
                f"with a dynamic batch, or set {FIELD} to the sizes it is deployed at",
            )
        worst = max(worst, diff)
    return worst
