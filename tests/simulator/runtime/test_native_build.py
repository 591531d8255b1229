"""Building the compiled kernels (simulator.runtime.native.build) with a stand-in compiler:
every source compiled to an object, one link, one build per hash across processes, and a
failing compiler named in our error."""

import os
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from schemas.errors import SimulatorError
from simulator.runtime import native

FAKE_CC = """#!/bin/sh
# a stand-in C compiler: logs its calls, writes the file after -o
echo "$@" >> "{log}"
[ "$1" = "--version" ] && {{ echo fake-cc 1.0; exit 0; }}
{fail}
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then echo built > "$2"; fi
  shift
done
"""


def _fake_cc(tmp_path, monkeypatch, fail: str = "") -> os.PathLike:
    log = tmp_path / "calls.log"
    cc = tmp_path / "fake-cc"
    cc.write_text(FAKE_CC.format(log=log, fail=fail))
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(cc))
    return log


def _calls(log) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if ln != "--version"]


def test_each_source_is_compiled_once_then_linked(tmp_path, monkeypatch):
    log = _fake_cc(tmp_path, monkeypatch)
    lib = native.build(tmp_path / "out", variant=native.BUILDS[0])
    calls = _calls(log)
    compiled = [c for c in calls if " -c " in f" {c} "]
    assert len(compiled) == len(native.SOURCES) + 1  # + the frozen plan's generated wrappers
    assert len(calls) == len(compiled) + 1 and calls[-1].endswith("-lm")  # one link
    assert lib.read_text() == "built\n"
    assert native.build(tmp_path / "out", variant=native.BUILDS[0]) == lib
    assert len(_calls(log)) == len(calls)  # built once per hash


def test_concurrent_builds_compile_once(tmp_path, monkeypatch):
    log = _fake_cc(tmp_path, monkeypatch)
    with ThreadPoolExecutor(4) as pool:
        libs = set(pool.map(lambda _: native.build(tmp_path / "out"), range(4)))
    assert len(libs) == 1
    assert sum(c.endswith("-lm") for c in _calls(log)) == 1


def test_a_failing_compiler_is_named_and_leaves_no_library(tmp_path, monkeypatch):
    _fake_cc(tmp_path, monkeypatch, fail='echo "qconv.c:1: error: broken" >&2; exit 1')
    with pytest.raises(SimulatorError, match="qconv.c:1: error: broken") as e:
        native.build(tmp_path / "out")
    assert "fake-cc" in e.value.what
    assert not list((tmp_path / "out").glob("*.so"))


def test_the_avx2_build_needs_simdes_headers(monkeypatch):
    flags = native._flags(native.BUILDS[1])
    assert "-DQPARITY_SIMDE" in flags and "-mavx2" in flags
    include = flags[flags.index("-I") + 1]
    assert os.path.exists(os.path.join(include, "simde", "x86", "avx512.h"))


@pytest.mark.parametrize(("version", "gcc"), [
    ("cc (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.", True),
    ("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu", False),
])  # fmt: skip
def test_gcc_only_flags_go_to_gcc_alone(monkeypatch, version, gcc):
    """-mtune-ctrl is GCC's: clang would reject the flag and the whole build with it."""
    monkeypatch.setattr(native, "_version", lambda cc: version)
    flags = native._flags(native.BUILDS[1], "/usr/bin/cc")
    assert all((f in flags) == gcc for f in native.AVX2_GCC_FLAGS)
    assert "-mavx2" in flags


@pytest.mark.parametrize("variant", native.BUILDS, ids=lambda b: b.name)
def test_every_source_compiles_as_every_build(variant, tmp_path):
    """The real compiler checks each source as each build (syntax and types, -fsyntax-only:
    seconds, where the optimizing build takes 20-90): the build a CPU cannot run still
    compiles, so a change to its code is checked on any machine."""
    cc = native._compiler()
    if cc is None:
        pytest.skip("no C compiler on PATH")
    gen = tmp_path / "packed.c"
    gen.write_text(native.packed.source(native.SIGNATURES))
    flags = [f for f in native._flags(variant) if f != "-shared"]
    for src in [*native.SOURCES, gen]:
        res = subprocess.run([cc, *flags, "-fsyntax-only", str(src)], capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert res.returncode == 0, f"{src.name} as the {variant.name} build: {res.stderr[-2000:]}"
