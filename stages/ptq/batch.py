"""The batch of a PTQ model: the proof that ``original`` computes what the user's file does.

``original`` rewrites the user's file: size computations folded, targets that follow the
batch rewritten (:mod:`stages.ptq.shapes`), a fixed batch made dynamic
(:mod:`stages.ptq.generalize`). :func:`prove_same` runs the file as given (in chunks of
its fixed batch, if it has one) and the rewritten model (on all frames at once) on the
first evaluation frames: every output must agree, else a StageError naming the output.
"""

from __future__ import annotations

import numpy as np
import onnx

from schemas.errors import StageError
from stages.onnx_runner import OnnxRunner

FIELD = "model.input_shapes"
RTOL = 1e-5
"""Outputs agree within ``RTOL * max |source|`` (batched kernels may sum in another order);
a wrong rewrite mixes frames or drops them, far beyond this."""


def fixed_batch(model: onnx.ModelProto) -> int | None:
    """The batch the model's first input fixes (dim 0 a number), or None (dynamic)."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return dims[0].dim_value if dims and dims[0].dim_value > 0 else None


def prove_same(
    source: onnx.ModelProto, model: onnx.ModelProto, x: np.ndarray, batch: int | None
) -> float:
    """Run ``source`` (chunks of ``batch``, or all of ``x``) and ``model`` (all of ``x``);
    the largest output difference relative to the source's magnitude."""
    if batch:
        x = x[: len(x) // batch * batch]
    chunks = [x[k : k + batch] for k in range(0, len(x), batch)] if batch else [x]
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
                f"file's on {len(x)} frames (shape {list(g.shape)} vs {list(w.shape)}, "
                f"max relative difference {diff:.3g})",
                where=f"{FIELD} / output {name}",
                hint="see debug/model_check_result.txt for the rewrites; export the model "
                f"with a dynamic batch, or set {FIELD} to the sizes it is deployed at",
            )
        worst = max(worst, diff)
    return worst
