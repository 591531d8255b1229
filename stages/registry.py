"""The one registry of stages: their order, inputs, output artifact types and functions.

A stage function has one signature, ``fn(upstream, ctx, call) -> Artifact``: ``upstream``
is the artifact of the nearest enabled stage before it (None for the first). Optional
stages run only when the spec enables them. ``data`` names the other inputs whose digests
enter the stage's cache key (data splits, the float model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from schemas.artifacts import (
    Artifact,
    BoardRun,
    CalibratedModel,
    HbmModel,
    PreparedModel,
    QatExportModel,
    QatOnnxModel,
    QatTunedModel,
    QuantizedModel,
)
from schemas.errors import SpecError
from schemas.fileio import sha256_bytes
from schemas.spec import STAGE_NAMES, PipelineSpec
from stages.board_sim import board_sim
from stages.calibrate import calibrate
from stages.compile import compile_model
from stages.convert.stage import convert
from stages.export import export
from stages.pre_export import pre_export
from stages.prepare import prepare
from stages.qat import qat


@dataclass(frozen=True)
class StageDef:
    """One row of the registry."""

    name: str
    fn: Callable
    output: type[Artifact]
    data: tuple[str, ...]
    needs: tuple[str, ...] = ()
    """The stages whose artifact this one takes, in preference order: the first enabled
    one is its upstream (pre_export takes qat's model when qat runs, else calibrate's)."""
    optional: bool = False

    def enabled(self, spec: PipelineSpec) -> bool:
        """Optional stages run when their section says ``enabled: true``."""
        section = getattr(spec.stages, self.name, None)
        return not self.optional or bool(getattr(section, "enabled", False))


STAGES: tuple[StageDef, ...] = (
    StageDef("prepare", prepare, PreparedModel, ("float_model", "evaluation")),
    StageDef("calibrate", calibrate, CalibratedModel, ("calibration", "evaluation"), ("prepare",)),
    StageDef("qat", qat, QatTunedModel, ("train", "evaluation"), ("calibrate",), optional=True),
    StageDef("pre_export", pre_export, QatExportModel, ("evaluation",), ("qat", "calibrate")),
    StageDef("export", export, QatOnnxModel, ("float_model", "evaluation"), ("pre_export",)),
    StageDef("convert", convert, QuantizedModel, ("calibration", "evaluation"), ("export",)),
    StageDef("compile", compile_model, HbmModel, ("evaluation",), ("convert",)),
    StageDef("board_sim", board_sim, BoardRun, ("evaluation", "camera"), ("compile",)),
)
BY_NAME = {s.name: s for s in STAGES}
CHAIN = STAGE_NAMES  # docs/design.md "The chain", in order (one list, in schemas.spec)


def get(name: str) -> StageDef:
    """The registry row of a stage; a SpecError lists the known names."""
    if name not in BY_NAME:
        raise SpecError(
            f"unknown stage '{name}'", where="stage", hint=f"use one of: {', '.join(BY_NAME)}"
        )
    return BY_NAME[name]


def plan(spec: PipelineSpec) -> list[tuple[StageDef, StageDef | None]]:
    """(stage, upstream stage) pairs to run, in dependency order.

    The DAG is the registry's ``needs``: a stage's upstream is its first enabled need.
    ``stages.run`` selects stages (plus everything they need), ``stages.stop_after`` cuts
    the chain after a stage; both together keep what satisfies both."""
    upstream = {s.name: _upstream(s, spec) for s in STAGES if s.enabled(spec)}
    wanted = set(upstream)
    if spec.stages.run is not None:
        wanted = _closure(spec.stages.run, upstream, spec)
    if spec.stages.stop_after:
        order = [s.name for s in STAGES]
        wanted = {n for n in wanted if order.index(n) <= order.index(spec.stages.stop_after)}
    return [(s, BY_NAME[upstream[s.name]] if upstream[s.name] else None)
            for s in STAGES if s.name in wanted]  # fmt: skip


def _upstream(stage: StageDef, spec: PipelineSpec) -> str | None:
    return next((n for n in stage.needs if BY_NAME[n].enabled(spec)), None)


def _closure(names: list[str], upstream: dict[str, str | None], spec) -> set[str]:
    """The named stages and, transitively, the stages they take their input from."""
    out: set[str] = set()
    for name in names:
        if name not in upstream:
            raise SpecError(
                f"stage {name} is not enabled",
                where="stages.run",
                hint=f"enable it (stages.{name}.enabled: true) or drop it from stages.run",
            )
        while name and name not in out:
            out.add(name)
            name = upstream[name]
    return out


CODE_PACKAGES = ("schemas", "simulator", "stages")
"""The folders whose files the stages run: every file in them enters the code version."""
NOT_CODE = frozenset({".md", ".pyc", ".pyo"})
"""Suffixes of files in them that cannot change a stage's result (docs, bytecode)."""


def source_files(root: Path) -> list[Path]:
    """Every file of :data:`CODE_PACKAGES` under ``root`` a stage's result may depend on:
    Python, the simulator's C kernels and headers, and any other file added there; not
    docs, bytecode or hidden files (editors' swap files, atomic writes' temp files)."""
    found = []
    for pkg in CODE_PACKAGES:
        for f in (root / pkg).rglob("*"):
            rel = f.relative_to(root).parts
            if (
                f.is_file()
                and f.suffix not in NOT_CODE
                and not any(p.startswith(".") or p == "__pycache__" for p in rel)
            ):
                found.append(f)
    return sorted(found, key=lambda f: f.relative_to(root).as_posix())


def source_digest(root: Path) -> str:
    """Digest of the paths and bytes of :func:`source_files` under ``root``."""
    parts = [
        f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() for f in source_files(root)
    ]
    return sha256_bytes(b"\0".join(parts))[:16]


@cache
def code_version() -> str:
    """Digest of the product code stages depend on (schemas, simulator, stages): its
    Python and its C sources, so an edited kernel never reuses cached results."""
    return source_digest(Path(__file__).resolve().parent.parent)
