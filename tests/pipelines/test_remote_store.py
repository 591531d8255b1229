"""Two "machines" share one run store on S3 (moto's S3 server on 127.0.0.1).

Machine A runs the digits chain up to calibrate into ``s3://qparity/runs``; machine B, a
separate process with its own empty mirror, lists it, runs the chain up to pre_export with
prepare and calibrate as cache hits from A's run, and queries both runs with SQL. (The
stages run and are cached alike: two of them show the sharing, at a quarter of the time.)
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")

ROOT = Path(__file__).resolve().parents[2]
URL = "s3://qparity/runs"
QUICK = ["--set", "data.evaluation_samples=64", "--no-prefect", "--quiet"]


@pytest.fixture(scope="module")
def s3():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    fs = s3fs.S3FileSystem(key="test", secret="test", endpoint_url=endpoint)
    fs.mkdir("qparity")
    env = {**creds, "AWS_DEFAULT_REGION": "us-east-1", "FSSPEC_S3_ENDPOINT_URL": endpoint}
    yield fs, env
    server.stop()


def run_ids(fs) -> list[str]:
    fs.invalidate_cache()
    names = [p.rsplit("/", 1)[-1] for p in fs.ls("qparity/runs")]
    return sorted(n for n in names if not n.startswith("."))


def qparity(env: dict, mirror: Path, *args: str) -> str:
    full = {
        **os.environ,
        **env,
        "PYTHONPATH": str(ROOT),
        "QPARITY_MIRROR": str(mirror),
        "COLUMNS": "250",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "qparity.cli", *args], env=full, cwd=ROOT,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_two_machines_share_runs_and_cache_through_s3(s3, tmp_path):
    fs, env = s3
    spec = "examples/digits/spec.yaml"
    qparity(
        env, tmp_path / "a", "run", spec, "--runs", URL, "--set", "stages.stop_after=calibrate", *QUICK
    )
    (first,) = run_ids(fs)
    manifest = json.loads(fs.cat(f"qparity/runs/{first}/manifest.json"))
    assert manifest["status"] == "complete"

    listed = qparity(env, tmp_path / "b", "runs", "--runs", URL)
    assert first in listed
    qparity(
        env,
        tmp_path / "b",
        "run",
        spec,
        "--runs",
        URL,
        "--set",
        "stages.stop_after=pre_export",
        *QUICK,
    )
    (second,) = set(run_ids(fs)) - {first}
    stages = json.loads(fs.cat(f"qparity/runs/{second}/manifest.json"))["stages"]
    for name in ("prepare", "calibrate"):
        assert stages[name]["cache_hit"] and stages[name]["cache_source_run"] == first, stages
    assert not stages["pre_export"]["cache_hit"]

    got = qparity(
        env, tmp_path / "c", "sql", "--runs", URL, "--format", "json",
        "SELECT run_id, count(*) FILTER (WHERE cache_hit) AS hits FROM stages GROUP BY run_id",
    )  # fmt: skip
    hits = {r["run_id"]: r["hits"] for r in json.loads(got)}
    assert hits == {first: 0, second: 2}
