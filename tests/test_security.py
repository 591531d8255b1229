"""Security rules of #9: no pickle, read-only SQL, spec paths inside allowed roots,
servers on localhost."""

from __future__ import annotations

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


def test_servers_we_start_bind_to_localhost():
    text = (ROOT / "pipelines" / "sweep_flow.py").read_text()
    assert '"host": "127.0.0.1"' in text


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
