"""`qparity sql` and `qparity diff` through typer, registered as the main CLI would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
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


TYPED = (
    "SELECT r.run_id, r.started_at, r.finished_at, s.duration_s, s.cache_hit, c.position, "
    "m.value, m.n_samples, 'a\"b,c' AS q, 1e-7 * m.value AS tiny, 1e20 * m.value AS big "
    "FROM runs r JOIN stages s USING (run_id) JOIN chain c ON c.stage = s.stage "
    "JOIN metrics m ON m.run_id = r.run_id AND m.stage = s.stage ORDER BY r.started_at, c.position"
)
"""Every column type of the tables (VARCHAR, TIMESTAMPTZ, DOUBLE, BOOLEAN, INTEGER, BIGINT),
NULL, a string to quote, floats printed in exponent form."""
TYPED_CSV = [
    '"R1",2026-01-01 00:00:00.000000Z,,1,false,2,0.9,100,"a""b,c",9e-8,9e+19',
    '"R1",2026-01-01 00:00:00.000000Z,,1,false,4,0.9,100,"a""b,c",9e-8,9e+19',
    '"R2",2026-01-02 00:00:00.000000Z,,1,true,2,0.9,100,"a""b,c",9e-8,9e+19',
    '"R2",2026-01-02 00:00:00.000000Z,,1,false,4,0.88,100,"a""b,c",8.8e-8,8.8e+19',
]


def _sql(root, query, *args):
    res = CliRunner().invoke(app, ["sql", query, "--runs", str(root), *args])
    assert res.exit_code == 0, res.output
    return res.stdout


def test_sql_prints_each_column_type_as_before(store):  # noqa: F811
    root, (r1, r2, _) = store
    ids = {r1: "R1", r2: "R2"}
    text = {f: _sql(root, TYPED, *f.split()) for f in ("-f csv", "-q", "-f json")}
    for run_id, name in ids.items():
        text = {f: t.replace(run_id, name) for f, t in text.items()}
    header = '"run_id","started_at","finished_at","duration_s","cache_hit","position","value",'
    assert text["-f csv"] == "\n".join([header + '"n_samples","q","tiny","big"', *TYPED_CSV, ""])
    assert text["-q"] == "\n".join([*TYPED_CSV, ""])
    rows = json.loads(text["-f json"])
    assert text["-f json"].startswith('[\n {\n  "run_id": "R1",\n  "started_at": ')
    assert rows[3] == {
        "run_id": "R2", "started_at": "2026-01-02T00:00:00+00:00", "finished_at": None,
        "duration_s": 1.0, "cache_hit": False, "position": 4, "value": 0.88, "n_samples": 100,
        "q": 'a"b,c', "tiny": 8.8e-08, "big": 8.8e19,
    }  # fmt: skip
    lines = _sql(root, "SELECT * FROM first_divergences ORDER BY run_id", "-q").splitlines()
    assert sorted(line.replace(r1, "R1").replace(r2, "R2") for line in lines) == [
        '"R1","convert","export","top1",0.05,,"conv2","Conv","max_qscale_diff",4,',
        '"R2","export","pre_export","top1",0.02,,"add1","Add","max_qscale_diff",3,',
    ]


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


LONG = "SELECT count(*) FROM range(100000) a, range(100000) b, range(100000) c"


def test_pivot_is_answered(store):  # noqa: F811
    root, _ = store
    q = "PIVOT runs ON status USING count(*) GROUP BY model ORDER BY model"
    res = CliRunner().invoke(app, ["sql", q, "--runs", str(root), "-f", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"model": "m", "complete": 2}, {"model": "n", "complete": 1}]


@pytest.mark.parametrize("how", ["option", "env"])
def test_the_time_limit_comes_from_the_option_or_the_environment(store, how):  # noqa: F811
    root, _ = store
    args = ["sql", LONG, "--runs", str(root)] + (["--timeout", "0.3"] if how == "option" else [])
    env = {"QPARITY_SQL_TIMEOUT": "0.3"} if how == "env" else {}
    res = CliRunner().invoke(app, args, env=env)
    assert isinstance(res.exception, QueryError), res.output
    assert "time limit of 0.3 s" in str(res.exception)


_CHILD = """
import signal
import sys

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
import analysis.query as q
from qparity.cli import main

original = q.execute

def traced(*args, **kwargs):
    print("query started", file=sys.stderr, flush=True)
    return original(*args, **kwargs)

q.execute = traced
sys.argv = ["qparity", "sql", sys.argv[1], "--runs", sys.argv[2], "--timeout", "0"]
main()
"""


def test_ctrl_c_cancels_a_running_query(store):  # noqa: F811
    root, _ = store
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, LONG, str(root)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stderr.readline().strip() == "query started"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)  # without the fix it never ends
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, err
    assert "the query was cancelled (Ctrl-C)" in err and "Traceback" not in err
