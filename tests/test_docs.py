"""The docs the code points at are in the repository: every ``*.md`` a source file, a
README or an error hint names exists, and every section it names ("Numerics") is a heading
of that file. A fresh clone has nothing outside the checkout to read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MD_REF = re.compile(r"(?<![\w/.-])([\w./-]*[A-Za-z]\w*\.md)\b")
SECTION_REF = re.compile(r"(docs/\w+\.md),? [\"']([^\"']+)[\"']")
SUFFIXES = {".py", ".md", ".yaml", ".sh", ".toml", ".sql", ".c", ".h"}


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [REPO / p for p in out.splitlines() if Path(p).suffix in SUFFIXES]


def _resolves(ref: str, source: Path) -> bool:
    return any((base / ref).is_file() for base in (REPO, source.parent))


def test_every_doc_a_file_names_is_in_the_repository():
    missing = [
        f"{path.relative_to(REPO)}: {ref}"
        for path in _tracked()
        for ref in MD_REF.findall(path.read_text(encoding="utf-8", errors="replace"))
        if not _resolves(ref, path)
    ]
    assert missing == []


OUTSIDE_DOC = re.compile(r"\b(DESIGN|NOTES|VENDOR-FACTS|VENDOR_FACTS)(\.md)?\b")
"""The notes this project was written from, kept outside the repository: a name of one,
with or without ``.md`` ("VENDOR-FACTS, 'Board input'"), points a reader at nothing."""


def test_no_file_points_at_the_notes_outside_the_repository():
    named = [
        f"{path.relative_to(REPO)}:{n}: {m.group(0)}"
        for path in _tracked()
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        for m in OUTSIDE_DOC.finditer(line)
    ]
    assert named == []


def test_every_section_a_file_names_is_a_heading_of_that_doc():
    headings = {
        doc: set(re.findall(r"^#+ (.+)$", (REPO / doc).read_text(), re.M))
        for doc in ("docs/design.md", "docs/environment.md")
    }
    wrong = [
        f"{path.relative_to(REPO)}: {doc} {section!r}"
        for path in _tracked()
        for doc, section in SECTION_REF.findall(path.read_text(encoding="utf-8", errors="replace"))
        if section not in headings.get(doc, set())
    ]
    assert wrong == []


def _security_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("- **Security.**", 1)[1].split("\n- **", 1)[0]


def test_the_security_section_names_every_spec_field_that_imports_code():
    """A spec is code: every field the product passes to import_object is named there."""
    imported = {
        field
        for path in _tracked()
        if path.suffix == ".py" and "tests" not in path.relative_to(REPO).parts
        for field in re.findall(r"import_object\([^)]*field=\"([\w.]+)\"", path.read_text())
    }
    section = _security_section()
    assert imported >= {"model.factory", "data.dataset"}
    assert [f for f in sorted(imported) if f"`{f}`" not in section] == []
    assert "a spec is code" in section.lower()


def test_the_security_section_says_dask_moves_specs_and_records_with_pickle():
    section = " ".join(_security_section().split())
    assert "Dask sweep ships each run's spec" in section and "records back" in section
    assert "pickle (cloudpickle)" in section


def test_every_superseded_bench_table_names_its_successor():
    """bench/README promises that a superseded table says so and names its successor: a
    bare "(superseded)" left the reader to guess which later table holds the numbers."""
    text = (REPO / "bench/README.md").read_text()
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    bare = re.findall(r"^.*\(superseded\b(?! by).*$", text, re.M | re.I)
    named = [" ".join(n.split()) for n in re.findall(r"superseded by \"([^\"]+)\"", text, re.I)]
    assert bare == []
    assert [n for n in named if not any(h.startswith(n) for h in headings)] == []
