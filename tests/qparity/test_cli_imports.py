"""The data commands start without the stage machinery: no torch, onnx or Prefect import
(bench/cli.py measures their start-up against python + duckdb)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "torchao", "onnx", "onnxruntime", "prefect")
CHILD = """
import sys
from qparity.cli import main
sys.argv = ["qparity", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print("heavy:", sorted(m for m in HEAVY if m in sys.modules))
""".replace("HEAVY", repr(HEAVY))


@pytest.mark.parametrize("args", [["--help"], ["runs"], ["sql", "SELECT 1 AS x"]])
def test_data_commands_import_no_stage_machinery(args, tmp_path):
    repo = Path(__file__).resolve().parents[2]
    runs = [] if args == ["--help"] else ["--runs", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-c", CHILD, *args, *runs], cwd=repo,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.stdout.strip().splitlines()[-1] == "heavy: []", proc.stderr[-500:]
