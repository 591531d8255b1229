"""The one exception hierarchy of qparity.

Every error a user can meet is a :class:`QparityError`. Its message is one short
paragraph: what went wrong, where (file, stage, layer, field) and what to do. Lower
errors are wrapped with ``raise ... from e`` so ``--debug`` still shows the cause.
"""

from __future__ import annotations


class QparityError(Exception):
    """Base of every error qparity raises on purpose.

    ``where`` names the file, stage, layer or field; ``hint`` says what to do.
    """

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None):
        self.what = what
        self.where = where
        self.hint = hint
        super().__init__(self.message)

    @property
    def message(self) -> str:
        parts = [f"{self.where}: {self.what}" if self.where else self.what]
        if self.hint:
            parts.append(f"Fix: {self.hint}")
        return " ".join(p.rstrip(".") + "." for p in parts)


class SpecError(QparityError):
    """A pipeline spec (or a setting given on the command line) is invalid."""


class StageError(QparityError):
    """A stage could not produce its artifact (bad model, bad data, unsupported op...)."""


class ArtifactError(QparityError):
    """An artifact or run folder is missing, incomplete or fails its digest check."""


class SimulatorError(QparityError):
    """The simulated BPU or its program format refused an input."""


class QueryError(QparityError):
    """A query over the run store is invalid or tried to write."""


class OrchestrationError(QparityError):
    """The orchestrator (Prefect's API server) could not be reached or started."""
