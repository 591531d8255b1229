"""A model's outputs by canonical id, whatever structure forward returns.

forward may return a tensor, a tuple/list, a dict or a nested mix. Its tensors are
flattened in torch's pytree order (the order torch.export lists them as graph outputs, so
qat.onnx, quantized.onnx and the .hbm program list them the same way) and each gets an id
from its path: ``output`` for a single tensor, ``output.0`` for a tuple's first,
``output.boxes`` for a dict's ``boxes``, ``output.scores.0`` nested. Every other leaf (a
string, None, a number) is refused, naming its path. Labels, top1 and the primary metric
apply to one output, the *judged* output: ``compare.output``, else the class-like one
((N, C) scores), else the first. With labels and several (N, C) outputs (class scores next
to a box regression) the judged output must be named: scoring the wrong head is silent.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.utils._pytree as pytree

from schemas.errors import SpecError, StageError
from schemas.metric_names import OUTPUT  # the id of a single output, the prefix of the others


def output_id(path: Sequence) -> str:
    """The canonical id of the leaf at pytree ``path`` (module docstring)."""
    keys = []
    for k in path:
        if isinstance(k, pytree.SequenceKey):
            keys.append(str(k.idx))
        elif isinstance(k, pytree.MappingKey):
            keys.append(str(k.key))
        else:  # a named tuple's or dataclass's field
            keys.append(str(getattr(k, "name", k)))
    return ".".join([OUTPUT, *keys])


def flat_outputs(out) -> dict[str, torch.Tensor]:
    """The tensors of a model's output by canonical id; a non-tensor leaf is refused."""
    leaves, _ = pytree.tree_flatten_with_path(out)
    flat = {}
    for path, leaf in leaves:
        oid = output_id(path)
        if not isinstance(leaf, torch.Tensor):
            raise StageError(
                f"the model's output {oid} is {type(leaf).__name__} {str(leaf)[:40]!r}, "
                "not a tensor",
                where=f"model.factory forward() -> {oid}",
                hint="return only tensors (a tensor, or tuples, lists and dicts of tensors); "
                "drop or encode the other values",
            )
        flat[oid] = leaf
    if not flat:
        raise StageError(
            "the model's forward returns no tensor",
            where="model.factory forward()",
            hint="return the model's output tensor(s)",
        )
    return flat


def first_output(out) -> torch.Tensor:
    """The first tensor of a model's output, in canonical-id order (the whole output of a
    one-tensor model)."""
    return next(iter(flat_outputs(out).values()))


def output_arrays(out) -> dict[str, np.ndarray]:
    """A model's outputs as arrays by canonical id."""
    return {k: np.asarray(v.detach().numpy()) for k, v in flat_outputs(out).items()}


def positional(ids: Sequence[str], values: Sequence, where: str) -> dict[str, np.ndarray]:
    """A graph's outputs (listed in pytree order) by the float model's output ids."""
    if len(values) != len(ids):
        raise StageError(
            f"the {where} model has {len(values)} outputs, the float model {len(ids)} "
            f"({', '.join(ids)})",
            where=where,
            hint="re-run the chain from prepare; the artifact is from another model",
        )
    return {oid: np.asarray(v) for oid, v in zip(ids, values, strict=True)}


def judged_output(
    outputs: dict[str, np.ndarray], named: str | None = None, labelled: bool = False
) -> str:
    """The output labels, top1 and the primary metric apply to (module docstring);
    ``labelled``: the dataset has labels (several class-like outputs are then refused)."""
    if named is not None:
        if named not in outputs:
            raise SpecError(
                f"compare.output: {named!r} is not an output of the model ({', '.join(outputs)})",
                where="compare.output",
                hint="name one of the model's output ids",
            )
        return named
    scores = [k for k, v in outputs.items() if np.ndim(v) == 2]
    if labelled and len(scores) > 1:
        raise SpecError(
            f"the labels could score any of the outputs {', '.join(scores)}",
            where="compare.output",
            hint="name the output the labels are classes of, e.g. "
            f"compare: {{output: {scores[-1]}}}",
        )
    return scores[0] if scores else next(iter(outputs))


def numpy_fed(run):
    """A graph runner fed a tuple of numpy inputs, callable as stage_metrics calls a model:
    one torch tensor per input, in the model's parameter order."""
    return lambda *xs: run(tuple(t.numpy() for t in xs))
