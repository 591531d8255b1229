"""`qparity sql` and `qparity diff` through typer, registered as the main CLI would."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from qparity.cli_sql import diff_command, sql_command
from schemas.errors import QueryError
from tests.analysis.test_query import store  # noqa: F401  (the fixture)

app = typer.Typer()
app.command("sql")(sql_command)
app.command("diff")(diff_command)


def test_sql_formats(store):  # noqa: F811
    root, (r1, r2, r3) = store
    q = "SELECT run_id, model FROM runs ORDER BY started_at"
    res = CliRunner().invoke(app, ["sql", q, "--runs", str(root), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [
        {"run_id": r1, "model": "m"},
        {"run_id": r2, "model": "m"},
        {"run_id": r3, "model": "n"},
    ]
    res = CliRunner().invoke(app, ["sql", q, "--runs", str(root), "-f", "csv"])
    assert res.stdout.splitlines() == [
        '"run_id","model"',
        f'"{r1}","m"',
        f'"{r2}","m"',
        f'"{r3}","n"',
    ]
    res = CliRunner().invoke(
        app, ["sql", "SELECT min(started_at) AS t FROM runs", "--runs", str(root)]
    )
    assert res.exit_code == 0 and "2026-01-01" in res.stdout and "1 row" in res.stdout


def test_sql_refuses_writes_with_a_query_error(store):  # noqa: F811
    root, _ = store
    res = CliRunner().invoke(app, ["sql", "DELETE FROM runs", "--runs", str(root)])
    assert isinstance(res.exception, QueryError)
    assert "DELETE statements are refused" in str(res.exception)


def test_diff_command(store):  # noqa: F811
    root, (r1, r2, _) = store
    res = CliRunner().invoke(app, ["diff", r1, r2, "--runs", str(root)], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "half_even" in res.stdout and "Localization" in res.stdout
