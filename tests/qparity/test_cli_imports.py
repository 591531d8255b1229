"""The data commands start without the stage machinery: no torch, onnx or Prefect import;
`runs` not even DuckDB or pyarrow, `show` no pyarrow or numpy (DuckDB parses the verified
bytes of the run's parts: schemas.table_rows), `sql` no spec models and no pyarrow or numpy
(DuckDB reads the parts, its rows are printed: analysis.sql_rows); `runs -q`,
`sql -q` and CSV or JSON not even rich; `runs` and `show` none of the other commands'
modules; none of them but `diff` (which compares specs) pydantic: manifests are plain
records (schemas.manifest), a run records what it is judged by, so `show` parses no spec,
and typer is pinned below 0.29, which coerces every parameter through pydantic.
bench/cli.py measures their start-up against python + duckdb."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from schemas.manifest import Judging
from schemas.store import RunStore
from schemas.table_schemas import SCHEMAS
from schemas.tables import write_rows
from tests.conftest import tiny_spec_dict

STAGES = ("torch", "torchao", "onnx", "onnxruntime", "prefect")
PYDANTIC = ("pydantic",)  # ~90 ms of CPU: runs, show and sql read no pydantic model
SQL = ("duckdb", "pyarrow.dataset", "pyarrow.compute")
SPEC = ("schemas.spec_sections", "analysis.diff")  # pydantic models `sql` does not need
PYARROW = ("pyarrow", "numpy")  # `sql` over small tables and `show`: DuckDB parses the parts
RICH = ("rich",)  # only a table or an error needs it: one-line outputs print without it
OTHERS = ("qparity.cli_sql", "qparity.cli_sweep", "qparity.cli_verify", "qparity.cli_ptq")
"""Modules of commands built on first use (qparity.cli_lazy): `runs` and `show` load none."""
JUDGING = Judging(top1_drop=0.005)
CHILD = """
import sys
from qparity.cli import main
heavy = sys.argv[1].split(",")
sys.argv = ["qparity", *sys.argv[2:]]
try:
    main()
except SystemExit:
    pass
print("heavy:", sorted(m for m in heavy if m in sys.modules))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store of one run with a spec, a runs row and a metrics row: what `show` and
    `diff` read."""
    root = tmp_path_factory.mktemp("runs")
    run = RunStore(root).create_run(
        "tiny", yaml.safe_dump(tiny_spec_dict()), "ab" * 32, "0.1.0", {}, {}, judging=JUDGING
    )
    row = {"run_id": run.run_id, "stage": "qat", "metric": "top1", "value": 0.5,
           "n_samples": 8, "output": "y"}  # fmt: skip
    write_rows(run, "metrics", [row], "qat")
    runs_row = dict.fromkeys(SCHEMAS["runs"].names) | {"run_id": run.run_id, "status": "complete"}
    write_rows(run, "runs", [runs_row], "run")
    return root, run.run_id


@pytest.mark.parametrize(
    ("args", "heavy"),
    [
        (["--help"], STAGES + PYDANTIC + SQL + PYARROW),
        (["runs"], STAGES + PYDANTIC + SQL + PYARROW + OTHERS),
        (["runs", "-q"], STAGES + PYDANTIC + SQL + PYARROW + RICH + OTHERS),
        (["show", "RUN"], STAGES + PYDANTIC + PYARROW + OTHERS),
        (["show", "RUN", "-q"], STAGES + PYDANTIC + PYARROW + OTHERS),
        (["sql", "SELECT * FROM first_divergences"], STAGES + PYDANTIC + SPEC + PYARROW),
        (
            ["sql", "SELECT * FROM first_divergences", "-q"],
            STAGES + PYDANTIC + SPEC + PYARROW + RICH,
        ),
        (["sql", "SELECT * FROM runs", "-f", "csv"], STAGES + PYDANTIC + SPEC + PYARROW + RICH),
        (["sql", "SELECT * FROM metrics", "-f", "json"], STAGES + PYDANTIC + SPEC + PYARROW + RICH),
        (["diff", "RUN", "RUN", "-q"], STAGES),
    ],
)
def test_data_commands_import_no_stage_machinery(args, heavy, store):
    root, run_id = store
    repo = Path(__file__).resolve().parents[2]
    argv = [run_id if a == "RUN" else a for a in args]
    argv += [] if args == ["--help"] else ["--runs", str(root)]
    proc = subprocess.run([sys.executable, "-c", CHILD, ",".join(heavy), *argv], cwd=repo,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.stdout.strip().splitlines()[-1] == "heavy: []", proc.stderr[-500:]
    assert "error" not in proc.stderr, proc.stderr[-500:]
