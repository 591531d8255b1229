"""The compiled kernels of the executor (simulator/csrc/*.c): built on first use, cached.

One more rides in the same library: ``qp_pair_sums`` (csrc/qstats.c), the analysis' per-layer
sums of a stage pair (:func:`analysis.metrics.sums`), in one pass where numpy needs twenty.

The C sources are compiled with the machine's C compiler (``$CC`` or ``cc``) into
``$QPARITY_NATIVE_CACHE`` (default ``~/.cache/qparity/native``), one shared library per
source hash, compiler and flags, written under a temporary name and renamed into place so
concurrent processes never load a half-written file. They are loaded with ctypes, which
releases the GIL during a call. OpenMP comes from the libgomp torch already loaded (same
soname), so both share one thread pool.

Two builds of the same sources (:data:`BUILDS`), the first this CPU runs is loaded: for
AVX-512 VNNI (the kernels as written), else for AVX2 + FMA (``qavx2.h``: the AVX-512
intrinsics as pairs of AVX2 ones through the simde-py package's SIMDe headers, VNNI's dot
products as exact ``vpmaddwd`` pairs, masked memory lane by lane; the same integers, which
the kernels' tests check against the reference on either build).

Everything here is optional: without a compiler, on a CPU with neither, or with
``QPARITY_NATIVE=0`` in the environment, :func:`library` returns None and the executor
keeps its torch kernels (same integers, slower). :func:`status` says which and why.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from schemas.errors import QparityError, SimulatorError
from schemas.fileio import atomic_save, atomic_write_text
from simulator.runtime import packed

LOG = logging.getLogger(__name__)
HINT = (
    "install a C compiler (e.g. apt install gcc) or set $CC; the executor runs its torch "
    "kernels meanwhile (same integers, slower); QPARITY_NATIVE=0 turns the kernels off"
)
SOURCES = tuple(Path(__file__).parents[1] / "csrc" / n
                for n in ("qconv.c", "qdw.c", "qamx.c", "qamxconv.c", "qrows.c", "qbmm.c",
                          "qnorm.c", "qmove.c", "qplan.c", "qnpy.c", "qpool.c", "qquant.c",
                          "qstats.c"))  # fmt: skip
FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-fno-strict-aliasing")
AVX2_FLAGS = ("-mavx2", "-mfma", "-DQPARITY_SIMDE", "-Wno-psabi")
AVX2_GCC_FLAGS = ("-mtune-ctrl=avx256_move_by_pieces,avx256_store_by_pieces",)
"""GCC only: copies of SIMDe's 512-bit values (GCC generic vectors it keeps in memory on
AVX2) in 32-byte moves, not 16. With its default 16-byte pieces, a value stored in halves
of 16 bytes and read back in 32 stalled store forwarding at nearly every SIMDe operation:
the transformer at batch 256, hot loop, 8.05 -> 4.75 ms a run with this flag; MobileNetV2
at batch 1 7.22 -> 6.97 ms (bench/README.md, "Timing after a real settle")."""


@dataclass(frozen=True)
class Build:
    """One build of the kernels: its name in status lines and its extra compiler flags."""

    name: str
    flags: tuple[str, ...] = ()
    simde: bool = False
    """Whether it needs SIMDe's headers (the simde-py package) on the include path."""
    cpu_flags: tuple[str, ...] = ()
    """/proc/cpuinfo's names of what it needs (its ``qp_cpu_ok()`` is the final word)."""
    gcc_flags: tuple[str, ...] = ()
    """Added when the compiler is GCC (its ``--version`` names the Free Software Foundation)."""


BUILDS = (
    Build("AVX-512 VNNI", cpu_flags=("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni")),
    Build("AVX2", AVX2_FLAGS, simde=True, cpu_flags=("avx2", "fma"), gcc_flags=AVX2_GCC_FLAGS),
)
"""The builds in order of preference: the first whose ``qp_cpu_ok()`` holds is loaded."""
P, I64, F64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
SIGNATURES = {
    "qp_cpu_ok": ([], ctypes.c_int),
    "qp_amx_ok": ([], ctypes.c_int),
    "qp_threads": ([I64], ctypes.c_int),
    "qp_pool_sizes": ([I64, I64], None),
    "qp_pool_owners": ([I64, I64, I64, P], None),
    "qp_pool_wake": ([], ctypes.c_int),
    "qp_pool_sleepers": ([], I64),
    "qp_pool_woken_spin": ([], I64),
    "qp_np_view": ([I64, P], None),
    "qp_linear_amx": ([P, *[I64] * 4, P, I64, I64, P, P, P, I64, P, *[I64] * 4, P, I64],
                      ctypes.c_int),
    "qp_pad": ([P, *[I64] * 11, P], None),
    "qp_pad_offset": ([], ctypes.c_int),
    "qp_conv": ([P, *[I64] * 6, P, *[I64] * 10, P, P, P, P, I64, P, *[I64] * 5, P, I64, I64],
                None),
    "qp_conv_amx": ([P, *[I64] * 6, P, *[I64] * 10, P, P, P, P, I64, P, *[I64] * 5, P,
                     *[I64] * 3], ctypes.c_int),
    "qp_dwconv": ([P, *[I64] * 5, P, *[I64] * 10, P, P, *[I64] * 4, P, I64, I64], None),
    "qp_mean": ([P, I64, I64, I64, F64, F64, F64, F64, I64, P, I64], None),
    "qp_mul": ([P, I64, P, I64, I64, I64, I64, F64, F64, F64, I64, P, I64], None),
    "qp_mean_cl": ([P, I64, I64, I64, I64, I64, I64, F64, F64, F64, F64, I64, P, I64], None),
    "qp_mul_cl": ([P, I64, P, I64, I64, I64, I64, I64, I64, F64, F64, F64, I64, P, I64], None),
    "qp_add": ([P, I64, P, I64, I64, I64, I64, P, P, I64, F64, F64, I64, P, I64], None),
    "qp_bmm": ([P, I64, P, I64, I64, I64, I64, I64, F64, F64, F64, I64, P, I64], None),
    "qp_gather": ([P, I64, I64, I64, I64, P, I64, P], None),
    "qp_quantize": ([P, I64, I64, I64, I64, P, I64, F64, F64, P, I64], ctypes.c_int),
    "qp_quantize_pad": ([P, *[I64] * 4, P, I64, I64, F64, F64, *[I64] * 5, P], ctypes.c_int),
    "qp_maxpool": ([P, *[I64] * 15, P], None),
    "qp_clip": ([P, I64, I64, I64, I64, P], None),
    "qp_copy": ([P, I64, P, P, P], None),
    "qp_bmm_strided": ([P, I64, P, P, I64, P, *[I64] * 5, F64, F64, F64, I64, P, I64], None),
    "qp_bmm_pairs": ([P, I64, P, P, I64, P, *[I64] * 5, F64, F64, F64, I64, P, I64], None),
    "qp_dequantize": ([P, I64, I64, I64, I64, P, P], None),
    "qp_to_nhwc": ([P, *[I64] * 5, P], None),
    "qp_softmax": ([P, I64, I64, I64, P, P, I64, F64, F64, I64, F64, F64, P, I64], None),
    "qp_layernorm": ([P, *[I64] * 5, F64, I64, P, I64, I64, P, P, F64, F64, F64, P, I64],
                     ctypes.c_int),
    "qp_pair_sums": ([P, I64, P, I64, I64, I64, F64, F64, F64, I64, P, P, P], None),
    packed.RUNNER: ([I64, P, P, P, P, I64, P, P, P, P], I64),
    packed.FAST_RUNNER: ([P, P, I64, I64], I64),
    packed.CHUNK_RUNNER: ([I64, P, I64, I64, I64, P, P, I64, P, P, P, I64, P], I64),
    packed.BATCH_RUNNER: ([P, P, P, I64], I64),
}  # fmt: skip
"""Every exported kernel's ctypes signature; simulator.runtime.packed writes the frozen plan's
wrappers from it, so a kernel's arguments are stated here only."""
PACKED = packed.names(SIGNATURES)


def cache_dir() -> Path:
    """Where built libraries live: ``$QPARITY_NATIVE_CACHE`` or ``~/.cache/qparity/native``."""
    env = os.environ.get("QPARITY_NATIVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qparity" / "native"


def _compiler() -> str | None:
    cc = os.environ.get("CC", "cc")
    return shutil.which(cc)


@functools.cache
def _version(cc: str) -> str:
    """``cc --version``'s output (part of the cache key; says whether cc is GCC)."""
    return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout


def _flags(b: Build, cc: str | None = None) -> tuple[str, ...]:
    """Every compiler flag of build ``b`` with compiler ``cc`` (default: :func:`_compiler`'s):
    SIMDe's include directory for the AVX2 one, its GCC flags when cc is GCC."""
    cc = cc or _compiler()
    own = b.flags + (b.gcc_flags if cc and "Free Software Foundation" in _version(cc) else ())
    if not b.simde:
        return FLAGS + own
    try:
        import simde_py
    except ImportError as e:
        raise SimulatorError("the AVX2 build of the kernels needs SIMDe's headers",
                             where="native kernels",
                             hint="pip install simde-py (a dependency of qparity)") from e  # fmt: skip
    return (*FLAGS, *own, "-I", simde_py.get_include())


def _key(cc: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for src in sorted(SOURCES[0].parent.glob("*.[ch]")):  # the sources and their headers
        h.update(src.name.encode() + src.read_bytes())
    h.update(packed.source(SIGNATURES).encode())
    h.update(_version(cc).encode() + " ".join(f for f in flags if f != "-I").encode())
    return h.hexdigest()[:16]


def build(target_dir: Path | None = None, variant: Build = BUILDS[0]) -> Path:
    """Compile the sources as ``variant`` (once per hash) and return the library's path.

    Raises SimulatorError naming the compiler command and its message when the build fails."""
    cc = _compiler()
    if cc is None:
        raise SimulatorError(f"no C compiler ({os.environ.get('CC', 'cc')}) on PATH",
                             where="native kernels", hint=HINT)  # fmt: skip
    flags = _flags(variant, cc)
    out_dir = target_dir or cache_dir()
    lib = out_dir / f"qparity-native-{_key(cc, flags)}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir, os.O_RDONLY)  # one build at a time (test workers): lock the folder
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not lib.exists():  # another process built it while this one waited
            _build_into(cc, flags, out_dir, lib)
    finally:
        os.close(fd)  # releases the lock
    return lib


def _build_into(cc: str, flags: tuple[str, ...], out_dir: Path, lib: Path) -> None:
    fd, gen = tempfile.mkstemp(suffix="-packed.c", dir=out_dir)  # the plan's wrappers
    os.close(fd)
    try:
        atomic_write_text(gen, packed.source(SIGNATURES))
        atomic_save(lib, lambda tmp: _compile(cc, flags, tmp, gen))
    finally:
        Path(gen).unlink(missing_ok=True)


def _compile(cc: str, flags: tuple[str, ...], out: str, gen: str) -> None:
    """Every source to an object at once (the cores share them: qconv.c alone is half of
    the AVX2 build's minute and a half), then one link into ``out``."""
    with tempfile.TemporaryDirectory(dir=Path(out).parent) as tmp:
        jobs = []
        try:
            for i, src in enumerate([*map(str, SOURCES), gen]):
                cmd = [cc, *flags, "-c", "-o", f"{tmp}/{i}.o", src]
                jobs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True)))  # fmt: skip
            for cmd, proc in jobs:
                _check(cmd, proc.communicate(timeout=600)[1], proc.returncode)
        finally:
            for _, proc in jobs:
                if proc.poll() is None:
                    proc.kill()
        cmd = [cc, *flags, "-o", out, *(f"{tmp}/{i}.o" for i in range(len(jobs))), "-lm"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        _check(cmd, res.stderr, res.returncode)


def _check(cmd: list[str], stderr: str, returncode: int) -> None:
    if returncode != 0:
        raise SimulatorError(f"{' '.join(cmd)} failed: {stderr.strip()[-800:]}",
                             where="native kernels", hint=HINT)  # fmt: skip


def _load(path: Path) -> ctypes.CDLL:
    # torch is imported above, so its libgomp is loaded first and the library shares it
    lib = ctypes.CDLL(str(path))
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


@functools.cache
def _state() -> tuple[ctypes.CDLL | None, str, str]:
    """(library or None, status line, the loaded build's name or "")."""
    if os.environ.get("QPARITY_NATIVE", "1") == "0":
        return None, "off (QPARITY_NATIVE=0)", ""
    lacks = []
    for variant in BUILDS:
        if not _may_run(variant):  # no build this CPU could not run (14-90 s of compiling)
            lacks.append(variant.name)
            continue
        try:
            lib = _load(build(variant=variant))
        except (QparityError, OSError, subprocess.SubprocessError) as e:
            LOG.info("compiled simulator kernels (%s) unavailable: %s", variant.name, e)
            return None, f"unavailable: {getattr(e, 'what', e)}", ""
        if lib.qp_cpu_ok():
            what = "convolution, row kernels, pooling, LayerNorm, softmax"
            return lib, f"on ({variant.name} build: {what})", variant.name
        lacks.append(variant.name)
    LOG.info("compiled simulator kernels off: this CPU lacks %s", " and ".join(lacks))
    return None, f"unavailable: this CPU lacks {' and '.join(lacks)}", ""


def _may_run(b: Build) -> bool:
    """False when /proc/cpuinfo lists flags and lacks one of ``b``'s; True when unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), None)  # fmt: skip
    return flags is None or set(b.cpu_flags) <= set(flags)


def build_name() -> str:
    """The loaded build's name ("AVX-512 VNNI", "AVX2"), "" when none is loaded."""
    return _state()[2]


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None when they cannot run here (:func:`status`); inside
    :func:`tracing`, a stand-in that records every call it forwards."""
    lib, traces = _state()[0], _TRACE.get()
    return lib if not traces or lib is None else _Recorder(lib, traces)


def untraced() -> ctypes.CDLL | None:
    """The loaded kernels (or None) even inside :func:`tracing`: for calls that are no part of
    an instruction's work (the run's thread count, :mod:`simulator.runtime.threads`)."""
    return _state()[0]


def amx() -> bool:
    """Whether the AMX-INT8 kernels (qamx.c, qamxconv.c) run: the kernels load, this CPU
    has AMX and the OS grants the tile state, and ``QPARITY_AMX`` is not ``0`` (read on each
    call, so tests can compare both paths)."""
    return os.environ.get("QPARITY_AMX", "1") != "0" and amx_supported()


@functools.cache
def amx_supported() -> bool:
    """Whether the kernels load, this CPU has AMX-INT8 and the OS grants the tile state
    (whatever ``QPARITY_AMX`` says)."""
    lib = _state()[0]
    return lib is not None and bool(lib.qp_amx_ok())


def linear_kernel() -> str:
    """Which kernel runs LINEAR here, and why not AMX when it does not (bench lines, skips)."""
    if _state()[0] is None:
        return f"the reference integer ops (compiled kernels {status()})"
    if not amx_supported():
        return f"{build_name()} (this CPU lacks AMX-INT8, or the OS does not grant its tile state)"
    if not amx():
        return f"{build_name()} (QPARITY_AMX=0)"
    return ("AMX-INT8 tiles (AVX-512 VNNI for int16 rows longer than exec_native.AMX_K_MAX; "
            "convs from exec_native.AMX_CONV_MIN on tiles too)")


def status() -> str:
    """One line: whether the compiled kernels run, and why not when they do not."""
    return _state()[1]


def code(t) -> int:
    """The kernels' dtype code of tensor ``t``: log2 of its element size (int8 / uint8 0,
    int16 1, int32 2)."""
    return t.element_size().bit_length() - 1


def int64s(*values: int) -> ctypes.Array:
    """A C array of int64 (shapes, strides) to pass where a kernel takes ``const int64_t *``."""
    return (ctypes.c_int64 * len(values))(*values)


def ptr(t) -> ctypes.c_void_p | None:
    """A tensor's data pointer for a ctypes call (None for None)."""
    if t is None:
        return None
    p = ctypes.c_void_p(t.data_ptr())
    for trace in _TRACE.get():
        trace.pointers[id(p)] = (p, t)
    return p


def empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty`` for a kernel's output or scratch buffer (what :func:`tracing`
    records as written by the calls, not read from outside)."""
    t = torch.empty(shape, dtype=dtype)
    for trace in _TRACE.get():
        trace.allocs.append(t)
    return t


@dataclass
class Trace:
    """What one kernel did at the ctypes boundary, for :mod:`simulator.runtime.replay`: its calls
    as ``(function, arguments, return value)``, the tensor behind each :func:`ptr`
    argument (by the pointer object's id) and the buffers it took from :func:`empty`.

    The contract that makes a trace replayable: a call's arguments depend only on the
    kernel's input geometry (dtype, shape, strides) and its constants, never on input
    values; a decision that depends on values comes back as the call's return value."""

    calls: list[tuple[object, tuple, object]] = field(default_factory=list)
    pointers: dict[int, tuple[ctypes.c_void_p, torch.Tensor]] = field(default_factory=dict)
    allocs: list[torch.Tensor] = field(default_factory=list)


_TRACE: contextvars.ContextVar[tuple[Trace, ...]] = contextvars.ContextVar("trace", default=())


@contextlib.contextmanager
def tracing():
    """Record the compiled calls made inside the block into the yielded :class:`Trace`
    (nested blocks: every open trace records them)."""
    trace = Trace()
    token = _TRACE.set((*_TRACE.get(), trace))
    try:
        yield trace
    finally:
        _TRACE.reset(token)


class _Recorder:
    """The library as seen inside :func:`tracing`: each call is made, then recorded."""

    def __init__(self, lib: ctypes.CDLL, traces: tuple[Trace, ...]):
        self._lib, self._traces = lib, traces

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)

        def call(*args):
            rc = fn(*args)
            for trace in self._traces:
                trace.calls.append((fn, args, rc))
            return rc

        return call
