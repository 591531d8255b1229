"""Imports go one way: schemas <- simulator <- stages <- analysis <- pipelines <- CLI."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["schemas", "simulator", "stages", "analysis", "pipelines", "qparity"]
OUTSIDE = {"examples", "bench", "tests"}


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module.split(".")[0]


def test_no_import_runs_upward_and_no_product_code_imports_examples():
    bad = []
    for rank, layer in enumerate(ORDER):
        for path in (ROOT / layer).rglob("*.py"):
            for top in _imports(path):
                if top in OUTSIDE or (top in ORDER and ORDER.index(top) > rank):
                    bad.append(f"{path.relative_to(ROOT)} imports {top}")
    assert bad == []


def test_simulator_never_imports_torch_side_stage_code():
    for path in (ROOT / "simulator").rglob("*.py"):
        assert "stages" not in set(_imports(path)), path
