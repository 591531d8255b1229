"""Security rules of #9: no pickle, read-only SQL, spec paths inside allowed roots,
servers on localhost."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from schemas.errors import SpecError
from schemas.paths import ROOTS_ENV, checked_path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("schemas", "simulator", "stages", "analysis", "pipelines", "qparity", "examples")
UNSAFE = {
    "pickle import": re.compile(r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b", re.M),
    "torch.load without weights_only": re.compile(r"torch\.load\((?![^)]*weights_only=True)"),
    "numpy pickle": re.compile(r"allow_pickle\s*=\s*True"),
    "yaml.load": re.compile(r"yaml\.load\("),
    "a server on every interface": re.compile(r"""["']0\.0\.0\.0["']"""),
}


def _sources():
    for pkg in PRODUCT:
        yield from (ROOT / pkg).rglob("*.py")


@pytest.mark.parametrize("rule", sorted(UNSAFE))
def test_product_code_never(rule):
    hits = [f"{p.relative_to(ROOT)}" for p in _sources() if UNSAFE[rule].search(p.read_text())]
    assert hits == []


def test_the_dask_cluster_a_sweep_starts_listens_on_localhost_only():
    """The LocalCluster of a ``runner: {kind: dask, workers: N}`` sweep, started by the
    product's own task runner: its scheduler, its workers and every socket any process of
    ours listens on are bound to a loopback address."""
    from pipelines.sweep import DaskRunner
    from pipelines.sweep_flow import task_runner

    with task_runner(DaskRunner(kind="dask", workers=1)) as runner:
        client = runner.client
        addresses = [client.scheduler.address, *client.scheduler_info()["workers"]]
        listening = _listening()
    assert len(addresses) == 2 and all(
        _loopback(a.split("//")[1].rsplit(":", 1)[0]) for a in addresses
    )
    assert {a.rsplit(":", 1)[1] for a in addresses} <= {str(port) for _, port in listening}
    assert [ip for ip, _ in listening if not _loopback(ip)] == []


def _listening() -> list[tuple[str, int]]:
    """(address, port) of every TCP socket this process and its children listen on."""
    import psutil

    me = psutil.Process()
    return [(c.laddr.ip, c.laddr.port) for p in (me, *me.children(recursive=True))
            for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]  # fmt: skip


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip.strip("[]")).is_loopback


def test_spec_paths_stay_inside_the_allowed_roots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    inside = tmp_path / "w.safetensors"
    assert checked_path(inside, "model.weights") == inside.resolve()
    with pytest.raises(SpecError, match="model.weights: /etc/passwd is outside") as e:
        checked_path("/etc/passwd", "model.weights")
    assert ROOTS_ENV in e.value.message
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(SpecError, match="outside"):
        checked_path(tmp_path / "link" / "passwd", "model.weights")
    monkeypatch.setenv(ROOTS_ENV, "/etc")
    assert checked_path("/etc/passwd", "model.weights") == Path("/etc/passwd")
