"""What the pipeline hands a stage function besides its input: the stamp for its output."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.artifacts import Artifact
from schemas.fileio import sha256_file
from schemas.store import Run


@dataclass(frozen=True)
class StageCall:
    """The identity of one stage execution: digests its artifact must carry."""

    stage: str
    inputs_digest: str
    config_digest: str
    code_version: str
    versions: dict[str, str] = field(default_factory=dict)

    def make(self, cls: type[Artifact], run: Run, files: list[str], **fields) -> Artifact:
        """The stage's artifact, with the sha256 of every file it owns."""
        digests = {rel: sha256_file(run.path(rel)) for rel in files}
        return cls(
            stage=self.stage,
            files=digests,
            inputs_digest=self.inputs_digest,
            config_digest=self.config_digest,
            code_version=self.code_version,
            versions=self.versions,
            **fields,
        )
