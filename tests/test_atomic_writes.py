"""Every file the product writes goes through schemas/fileio.py's atomic writer (unique temp
name, fsync, rename, folder fsync): a scan of the product code for any other way to write a
file, and each product writer killed mid-write leaving the old file intact."""

from __future__ import annotations

import ast
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from schemas import fileio

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("schemas", "simulator", "stages", "analysis", "pipelines", "qparity", "examples")
WRITER = "schemas/fileio.py"
CALLS = {"onnx.save", "onnx.save_model", "os.replace", "os.rename", "os.link", "shutil.move",
         "shutil.copy", "shutil.copy2", "shutil.copyfile", "np.save", "np.savez", "torch.save",
         "pq.write_table"}  # fmt: skip
"""Calls that write or rename a file by name (``save_file`` of any module too)."""
ALLOWED = {
    ("schemas/tables.py", "pq.write_table"): "writes into atomic_writer's open file",
    ("examples/zoo/data.py", "np.savez"): "writes into atomic_writer's open file",
    ("schemas/store.py", "open"): "the manifest lock, opened for flock and never written",
    ("schemas/remote.py", "open"): "the sync-state lock, opened for flock and never written",
    ("schemas/table_rows.py", "path.write_bytes"): "a verified part's private copy for DuckDB "
    "in a fresh temporary folder (no memfd), removed after the read: never a store file",
}


def _name(func: ast.expr) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    parts.append(func.id if isinstance(func, ast.Name) else "(...)")
    return ".".join(reversed(parts))


def _writes(call: ast.Call) -> str | None:
    """The call's name when it writes a file outside the atomic writer, else None."""
    name, n = _name(call.func), len(call.args)
    method = name.rsplit(".", 1)[-1]
    if name in CALLS or method == "save_file":
        return name
    if method in ("write_text", "write_bytes") and n == 1:  # Path's (the store's takes 2)
        return name
    if method in ("replace", "rename") and n == 1 and not call.keywords:  # Path's, not
        return name  # str.replace(a, b) or dataclasses.replace(obj, field=...)
    if name == "open":
        mode = (
            call.args[1]
            if n > 1
            else next((k.value for k in call.keywords if k.arg == "mode"), None)
        )
        if mode is not None and (
            not isinstance(mode, ast.Constant) or set(mode.value) & set("wax+")
        ):
            return name
    return None


def _through_atomic_save(tree: ast.AST) -> set[int]:
    """Nodes inside the arguments of an ``atomic_save`` call (its save callback)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func).endswith("atomic_save"):
            inside |= {id(n) for arg in node.args for n in ast.walk(arg)}
    return inside


def _offenders() -> list[str]:
    found = []
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text())
            fine = _through_atomic_save(tree)
            for node in ast.walk(tree):
                name = _writes(node) if isinstance(node, ast.Call) else None
                if name and id(node) not in fine and rel != WRITER and (rel, name) not in ALLOWED:
                    found.append(f"{rel}:{node.lineno} {name}(...)")
    return found


def test_product_code_writes_files_only_through_the_atomic_writer():
    assert _offenders() == [], "use schemas.fileio.atomic_save / atomic_writer instead"


def test_the_scan_sees_each_kind_of_write():
    src = """
onnx.save(m, str(p)); os.replace(a, b); safetensors.torch.save_file(s, t)
Path(g).write_text(x); tmp.replace(path); open(p, "wb"); open(p, mode="a")
run.write_text("rel", text); name.replace("a", "b"); open(p); open(p, "rb")
dataclasses.replace(c, native=n); RunStore(r).open(i); atomic_save(p, lambda t: onnx.save(m, t))
"""
    tree = ast.parse(src)
    fine = _through_atomic_save(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and id(n) not in fine]
    assert sorted(filter(None, map(_writes, calls))) == sorted(
        ["onnx.save", "os.replace", "safetensors.torch.save_file", "(...).write_text",
         "tmp.replace", "open", "open"]
    )  # fmt: skip


class Killed(BaseException):
    """What the crash point raises here instead of SIGKILL (the process must go on)."""


def _tiny_onnx() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph)


def _save_state(path):
    from stages.modelio import save_state

    save_state(torch.nn.Linear(2, 2), path)


def _ptq_save(path):
    from stages.ptq.graph import save_model

    save_model(_tiny_onnx(), path)


def _convert_save(path):
    from stages.convert.stage import _save

    _save(_tiny_onnx(), path)


def _export_onnx(path):
    from stages.onnx_export import export_onnx
    from tests.models import tiny
    from tests.stages.test_onnx_export import X, _calibrated

    export_onnx(_calibrated(tiny(), X)[0], X[:2], path)


def _weights(path):
    from examples.weights import save_atomic

    save_atomic(torch.nn.Linear(2, 2), path, "k")


def _hbm(path):
    from simulator.program import hbm
    from tests.simulator.program.test_hbm import small_program

    hbm.save(small_program(), path)


@pytest.mark.parametrize("write", [_save_state, _ptq_save, _convert_save, _export_onnx,
                                   _weights, _hbm])  # fmt: skip
def test_a_writer_killed_before_its_rename_leaves_the_old_file(write, tmp_path, monkeypatch):
    """Stopped at the crash point (new data written and fsynced, not yet renamed), the
    write leaves the old bytes under the real name and no other file behind."""
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")

    def crash():
        raise Killed

    monkeypatch.setattr(fileio, "_crash_point", crash)
    with pytest.raises(Killed):
        write(path)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
