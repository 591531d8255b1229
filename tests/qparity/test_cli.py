"""The command line: short errors that say what to fix, exit codes, nothing marked complete."""

import pytest

from qparity import cli
from schemas.store import RunStore
from tests.conftest import cli_exit_code, tiny_spec_dict


def _run(monkeypatch, capsys, tmp_path, spec_path):
    code = cli_exit_code(monkeypatch, "run", spec_path, "--runs", tmp_path / "runs", "--no-prefect")
    return code, capsys.readouterr()


def test_misspelled_key_names_file_field_and_fix(monkeypatch, capsys, tmp_path, write_spec):
    data = tiny_spec_dict(quant={"obsrever": "minmax"})
    code, io = _run(monkeypatch, capsys, tmp_path, write_spec(data))
    assert code == 1
    assert "spec.yaml: quant.obsrever: unknown key" in io.err and "Fix:" in io.err
    assert "Traceback" not in io.err
    assert RunStore(tmp_path / "runs").list_runs() == []


def test_factory_that_does_not_import(monkeypatch, capsys, tmp_path, write_spec):
    data = tiny_spec_dict(model={"factory": "tests.no_such_module:build"})
    code, io = _run(monkeypatch, capsys, tmp_path, write_spec(data))
    assert code == 1
    assert "model.factory: cannot import module 'tests.no_such_module'" in io.err
    assert [m.status for m in RunStore(tmp_path / "runs").list_runs()] == ["failed"]


def test_unsupported_op(monkeypatch, capsys, tmp_path, write_spec):
    code, io = _run(
        monkeypatch,
        capsys,
        tmp_path,
        write_spec(tiny_spec_dict(model={"factory": "tests.models:cumsum"})),
    )
    assert code == 1 and "unsupported op(s): aten.cumsum.default" in io.err
    (m,) = RunStore(tmp_path / "runs").list_runs()
    assert m.status == "failed"


def test_run_then_runs_and_show(monkeypatch, capsys, tmp_path, write_spec):
    code, io = _run(monkeypatch, capsys, tmp_path, write_spec(tiny_spec_dict()))
    assert code == 0 and "calibrate" in io.out and "computed" in io.out
    (m,) = RunStore(tmp_path / "runs").list_runs()
    assert cli_exit_code(monkeypatch, "runs", "--runs", tmp_path / "runs") == 0
    assert m.run_id in capsys.readouterr().out
    assert cli_exit_code(monkeypatch, "show", m.run_id, "--runs", tmp_path / "runs") == 0
    out = capsys.readouterr().out
    assert "top1" in out and "float" in out and "complete" in out


def test_a_missing_argument_is_a_usage_error_not_an_internal_error(monkeypatch, capsys):
    assert cli_exit_code(monkeypatch, "report") == 2
    err = capsys.readouterr().err
    assert "Missing argument 'run_id'" in err and "internal error" not in err


def test_show_refuses_a_path_as_run_id(monkeypatch, capsys, tmp_path):
    assert cli_exit_code(monkeypatch, "show", "../etc", "--runs", tmp_path) == 1
    assert "invalid run id" in capsys.readouterr().err


def test_quiet_run_prints_one_line_and_localize_prints_the_summary(
    monkeypatch, capsys, tmp_path, write_spec
):
    args = ("run", write_spec(tiny_spec_dict()), "--runs", tmp_path / "runs", "--no-prefect")
    assert cli_exit_code(monkeypatch, *args, "--quiet") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    (m,) = RunStore(tmp_path / "runs").list_runs()
    assert lines == [f"{m.run_id} complete, no divergence"]
    assert cli_exit_code(monkeypatch, "localize", m.run_id, "--runs", tmp_path / "runs") == 0
    out = capsys.readouterr().out
    assert "no stage diverges" in out and "compare_per_layer_out.txt" in out
    _quiet_commands_print_one_line_per_result(monkeypatch, capsys, tmp_path / "runs", m.run_id)


def _quiet_commands_print_one_line_per_result(monkeypatch, capsys, store, run_id) -> None:
    """--quiet on the commands that read a finished run: one line per result, no table."""
    sql = "SELECT stage, metric FROM metrics WHERE stage = 'board_sim' AND metric = 'top1'"
    expected = {
        ("runs",): [run_id],
        ("show", run_id): [f"{run_id} complete board_sim top1 "],
        ("localize", run_id): [f"{run_id} no divergence"],
        ("sql", sql): ['"board_sim","top1"'],
        ("diff", run_id, run_id): ["no difference"],
        ("gc",): [],
        ("report", run_id): [str(store / run_id / "report.html")],
    }
    for args, lines in expected.items():
        assert cli_exit_code(monkeypatch, *args, "--runs", store, "--quiet") == 0
        got = capsys.readouterr().out.splitlines()
        assert len(got) == len(lines), args
        assert all(g.startswith(x) for g, x in zip(got, lines, strict=True)), args


def test_every_command_takes_quiet():
    import typer

    group = typer.main.get_command(cli.app)
    lacking = [
        name
        for name, command in group.commands.items()
        if not any("--quiet" in p.opts and "-q" in p.opts for p in command.params)
    ]
    assert lacking == []


@pytest.mark.parametrize(
    "command", [("runs",), ("sql", "SELECT 1"), ("run", "SPEC", "--no-prefect")]
)
def test_runs_naming_a_file_is_one_clear_error(monkeypatch, capsys, tmp_path, write_spec, command):
    not_a_folder = tmp_path / "notes.txt"
    not_a_folder.write_text("x")
    args = [write_spec(tiny_spec_dict()) if a == "SPEC" else a for a in command]
    assert cli_exit_code(monkeypatch, *args, "--runs", not_a_folder) == 1
    err = capsys.readouterr().err.replace("\n", "")
    assert f"{not_a_folder}: the run store is not a folder: it must be a folder (or a URL)" in err
    assert "internal error" not in err


def test_a_symlinked_run_folder_is_named_and_neither_listed_nor_shown(
    monkeypatch, capsys, tmp_path
):
    store = RunStore(tmp_path / "runs")
    real = store.create_run("real", "", "ab" * 32, "0.1.0", {}, {})
    (store.root / "twin").symlink_to(real.root, target_is_directory=True)
    assert cli_exit_code(monkeypatch, "runs", "--runs", store.root) == 0
    io = capsys.readouterr()
    assert io.out.count(real.run_id) == 1 and "twin" not in io.out
    assert f"warning: {store.root / 'twin'}: a symlink to {real.root}" in io.err.replace("\n", "")
    assert cli_exit_code(monkeypatch, "show", "twin", "--runs", store.root) == 1
    assert "symlinked run folders are refused" in capsys.readouterr().err


LOCALIZATION_TABLES = ("layer_stats", "badcases", "layer_tensors", "localization", "sensitivity")


def _table_bytes(run, tables) -> dict:
    return {p: p.read_bytes() for t in tables for p in run.path(f"tables/{t}").rglob("*.parquet")}


def test_a_tampered_table_fails_localize_show_diff_and_report_and_changes_nothing(
    monkeypatch, capsys, tmp_path, write_spec
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "runs"
    args = ("run", write_spec(tiny_spec_dict()), "--runs", root, "--no-prefect", "--quiet")
    assert cli_exit_code(monkeypatch, *args) == 0
    (m,) = RunStore(root).list_runs()
    run = RunStore(root).open(m.run_id)
    part = run.path("tables/metrics/calibrate.parquet")
    rows = pq.read_table(part).to_pylist()
    rows[0]["value"] += 0.5  # a valid Parquet file, one metric changed
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(part)), part)
    before = _table_bytes(run, LOCALIZATION_TABLES)
    assert before and all(before.values())
    capsys.readouterr()
    for command in (("localize", m.run_id), ("show", m.run_id), ("diff", m.run_id, m.run_id),
                    ("report", m.run_id)):  # fmt: skip
        assert cli_exit_code(monkeypatch, *command, "--runs", root) == 1, command
        err = capsys.readouterr().err.replace("\n", "")
        assert f"{part}: table part was changed after the run wrote it" in err, command
        assert "rerun the run" in err
    after = _table_bytes(run, LOCALIZATION_TABLES)
    assert after == before


def test_a_prefect_server_that_does_not_start_is_one_clear_error(
    monkeypatch, capsys, tmp_path, write_spec
):
    """#21 item 4 through the CLI: the temporary server timing out twice (faked) stops
    `qparity run` with exit 1 and a message naming --no-prefect and `prefect server start`."""
    import functools

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from pipelines import flow, prefect_server

    def never_starts():
        raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server.")

    monkeypatch.setenv("QPARITY_PREFECT_STARTUP_S", "1")
    monkeypatch.setattr(
        flow, "prefect_ready", functools.partial(prefect_server.prefect_ready, never_starts)
    )
    spec = write_spec(tiny_spec_dict())
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert cli_exit_code(monkeypatch, "run", spec, "--runs", tmp_path / "runs") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "the temporary Prefect server did not start within 1 s, 2 attempts" in err
    assert "--no-prefect" in err and "prefect server start" in err
    assert "internal error" not in err and "Traceback" not in err
    assert RunStore(tmp_path / "runs").list_runs() == []  # checked before a run is made
