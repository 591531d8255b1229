"""The manifest records (schemas.manifest, checked by schemas.records) against the
pydantic models they replace (strict mode, where an int is taken for a float, as JSON has
one number type): the same documents accepted and refused, the same dumps, and errors
that name the field."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.manifest import Judging, Manifest, ManifestError, RunOwner, StageRecord


class _Ref(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RefStage(_Ref):
    stage: str
    status: Literal["running", "complete", "failed", "skipped", "interrupted"]
    started_at: str
    finished_at: str | None = None
    duration_s: float | None = None
    cache_hit: bool = False
    cache_source_run: str | None = None
    artifact_digest: str | None = None
    error: str | None = None


class RefOwner(_Ref):
    host: str
    pid: int
    process: str | None = None
    heartbeat_at: str


class RefJudging(_Ref):
    primary: str | None = None
    output: str | None = None
    top1_drop: float
    primary_drop: float | None = None


class RefManifest(_Ref):
    run_id: str
    name: str
    spec_digest: str
    status: Literal["running", "complete", "failed", "interrupted"]
    started_at: str
    finished_at: str | None = None
    stages: dict[str, RefStage] = {}
    code_version: str
    versions: dict[str, str] = {}
    tags: dict[str, str] = {}
    parent_run: str | None = None
    error: str | None = None
    owner: RefOwner | None = None
    judging: RefJudging | None = None
    tables: dict[str, str] | None = None
    tables_pending: dict[str, str | None] = {}


STAGE = {"stage": "convert", "status": "complete", "started_at": "2026-12-04T10:00:00",
         "finished_at": "2026-12-04T10:00:03", "duration_s": 3.5, "cache_hit": False,
         "artifact_digest": "ab" * 32}  # fmt: skip
OWNER = {"host": "h", "pid": 41, "process": "boot:99", "heartbeat_at": "2026-12-04T10:00:03"}
BASE = {
    "run_id": "digits-20261204T100000-abcdef", "name": "digits", "spec_digest": "cd" * 32,
    "status": "complete", "started_at": "2026-12-04T10:00:00", "stages": {"convert": STAGE},
    "code_version": "0.1.0", "versions": {"torch": "2.13.0"}, "tags": {"owner": "me"},
    "owner": OWNER, "judging": {"top1_drop": 0.005, "primary": "cosine"},
    "tables": {"tables/metrics/convert.parquet": "ef" * 32},
    "tables_pending": {"tables/runs/run.parquet": None},
}  # fmt: skip
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=3), st.sampled_from(["complete", "running", "skipped", "weird"]),
    st.dictionaries(st.text(max_size=2), st.one_of(st.none(), st.text(max_size=2), st.integers())),
    st.lists(st.integers(), max_size=2), st.just(STAGE), st.just(OWNER),
)  # fmt: skip


def _edited(path: tuple[str, ...], key: str, value, drop: bool) -> dict:
    """BASE with ``key`` of the record at ``path`` set to ``value`` (or dropped)."""
    doc = json.loads(json.dumps(BASE))
    record = doc
    for part in path:
        record = record[part]
    if drop:
        record.pop(key, None)
    else:
        record[key] = value
    return doc


def _outcome(validate, doc):
    try:
        return "ok", validate(doc).model_dump(mode="json")
    except (ValidationError, ManifestError):
        return "refused", None


RECORDS = {
    (): BASE,
    ("stages", "convert"): STAGE,
    ("owner",): OWNER,
    ("judging",): {"primary": None, "output": None, "top1_drop": 0, "primary_drop": None},
}
SAMPLES = [None, True, False, 0, 3, 3.5, -1e300, "", "complete", "skipped", {}, {"a": "b"},
           {"a": None}, {"a": 1}, [], STAGE, OWNER, {"convert": STAGE}]  # fmt: skip


def test_every_field_with_every_kind_of_value_as_the_pydantic_models():
    """Each field of each record set to a sample of every JSON kind, or dropped, and an
    unknown field added: both accept or both refuse, and accepted ones dump the same."""
    for path, record in RECORDS.items():
        for key in [*record, "bogus"]:
            for value, drop in [*((v, False) for v in SAMPLES), (None, True)]:
                doc = _edited(path, key, value, drop)
                ours = _outcome(Manifest.model_validate, doc)
                assert ours == _outcome(RefManifest.model_validate, doc), (path, key, value)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from(list(RECORDS)), VALUES, st.booleans())
def test_random_edits_as_the_pydantic_models(data, path, value, drop):
    key = data.draw(st.sampled_from([*RECORDS[path], "bogus"]))
    doc = _edited(path, key, value, drop)
    assert _outcome(Manifest.model_validate, doc) == _outcome(RefManifest.model_validate, doc)


def test_json_round_trip_and_copy():
    m = Manifest.model_validate_json(json.dumps(BASE).encode())
    assert m.stages["convert"] == StageRecord(**STAGE)
    assert m.owner == RunOwner(**OWNER) and m.judging == Judging(top1_drop=0.005, primary="cosine")
    assert m.model_dump() == RefManifest.model_validate(BASE).model_dump(mode="json")
    assert Manifest.model_validate(m.model_dump()) == m and Manifest.model_validate(m) is m
    done = m.model_copy(update={"status": "failed", "error": "boom"})
    assert (done.status, done.error, m.status) == ("failed", "boom", "complete")
    with pytest.raises(ManifestError, match="status: expected one of"):
        m.model_copy(update={"status": "done"})  # a copy is checked like a new record
    with pytest.raises(AttributeError):
        m.status = "failed"  # frozen


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_edited(("stages", "convert"), "cache_hit", 1, False),
         "stages.convert.cache_hit: expected bool, got int 1"),
        (_edited(("owner",), "pid", None, True), "owner.pid: field required"),
        (_edited((), "bogus", 1, False), "bogus: unknown field"),
        (_edited((), "status", "done", False), "status: expected one of 'running'"),
        (_edited(("judging",), "top1_drop", 2**2000, False),
         "judging.top1_drop: expected float, got an int of 2001 bits"),
        (_edited((), "tables_pending", {"a": 3}, False),
         "tables_pending.a: expected str, got int 3"),
        ([BASE], "expected an object, got list"),
        (_edited((), "status", "x" * 10**6, False), "status: expected one of .* 'xxx+\\.\\.\\.$"),
    ],
)  # fmt: skip
def test_errors_name_the_field(doc, message):
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Manifest.model_validate(doc)


@pytest.mark.parametrize(
    "raw", [b"{not json", b"\xff\xfe\x00", b"", b"[1", b"[" * 100_000 + b"]" * 100_000]
)
def test_a_document_that_is_not_json_is_a_manifest_error(raw):
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.model_validate_json(raw)
