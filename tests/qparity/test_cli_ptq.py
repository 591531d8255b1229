"""``qparity ptq`` and ``qparity localize`` of a PTQ run judged by a task metric."""

import yaml

from schemas.store import RunStore
from tests.conftest import cli_exit_code
from tests.stages.ptq.conftest import export_tiny


def test_the_stage_table_and_localize_judge_by_compare_primary(monkeypatch, capsys, tmp_path):
    spec = {
        "model": {"file": str(export_tiny(tmp_path / "tiny.onnx"))},
        "data": {"dataset": "tests.models:data", "calibration_samples": 32,
                 "evaluation_samples": 32, "batch_size": 16,
                 "metric": "tests.stages.test_evaluate:miou"},
        "compare": {"primary": "miou"},
    }  # fmt: skip
    (tmp_path / "ptq.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("QPARITY_ALLOWED_ROOTS", str(tmp_path))
    runs = tmp_path / "runs"
    assert (
        cli_exit_code(monkeypatch, "ptq", tmp_path / "ptq.yaml", "--runs", runs, "--no-prefect")
        == 0
    )
    head = next(line for line in capsys.readouterr().out.splitlines() if "stage" in line)
    assert "miou" in head and "top1" not in head  # the primary metric's column
    (m,) = RunStore(runs).list_runs()
    assert cli_exit_code(monkeypatch, "localize", m.run_id, "--runs", runs) == 0
    assert "miou of output" in capsys.readouterr().out
