"""The models ``qparity verify`` can compare: run stages, ONNX files and .hbm files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.verify import Side
from schemas.errors import SpecError


def side(ref: str, store_root: str | Path) -> Side:
    """``RUN_ID:stage``, or a path to an .onnx or .hbm file."""
    path = Path(ref)
    if path.suffix == ".onnx":
        return _onnx(path)
    if path.suffix == ".hbm":
        return _hbm(path)
    run_id, sep, stage = ref.rpartition(":")
    if not sep or not run_id:
        raise SpecError(
            f"cannot tell what model {ref!r} is",
            where="verify",
            hint="give RUN_ID:stage (e.g. my-run:convert), a .onnx file or a .hbm file",
        )
    return _stage(run_id, stage.replace("-", "_"), store_root)


def _onnx(path: Path) -> Side:
    from stages.onnx_runner import OnnxRunner

    runner = OnnxRunner(path)
    node_of = {o: n.name or n.op_type for n in runner.model.graph.node for o in n.output if o}
    names = [t for t in node_of if t not in runner.output_names]

    def run(x):
        outs, values = runner.run_capture(x, names)
        return [np.asarray(o) for o in outs], values, node_of

    return Side(str(path), run, True)


def _hbm(path: Path) -> Side:
    from simulator.program import hbm
    from simulator.runtime.executor import Executor

    executor = Executor(hbm.load(path))
    inputs = list(executor.program.inputs)
    if len(inputs) != 1:
        raise SpecError(
            f"{path} takes {len(inputs)} inputs ({', '.join(inputs)})",
            where="verify",
            hint="verify the featuremap program (model.hbm), not the camera one",
        )

    def run(x):
        outs, _ = executor.run({inputs[0]: x})
        return [np.asarray(o) for o in outs.values()], {}, {}

    return Side(str(path), run, False)


def _stage(run_id: str, stage: str, store_root: str | Path) -> Side:
    from schemas.spec import load_spec
    from schemas.store import RunStore
    from stages.context import RunContext
    from stages.data import Split
    from stages.stage_models import open_stage_model

    run = RunStore(store_root).open(run_id)
    ctx = RunContext(spec=load_spec(run.path("spec.yaml")), run=run, code_version="")
    model = open_stage_model(ctx, stage)

    def run_x(x):
        split = Split("evaluation", {"x": np.ascontiguousarray(x)})
        ctx.__dict__["splits"] = {"evaluation": split, "camera": split}  # the given input
        out, values = model.run(np.arange(len(x)))
        return [out], values, {}

    return Side(f"{run_id}:{stage}", run_x, stage not in ("compile", "board_sim"))
