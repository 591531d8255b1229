"""Kernel calls as arrays of 64-bit slots, for the runner of a frozen plan (csrc/qplan.c).

A frozen plan (:mod:`simulator.runtime.frozen`) makes the same calls every run. A ctypes call
converts each of its 8-31 arguments (about 4 us a call: a sixth of the transformer
example's run once its kernels got fast), so the plan instead keeps every argument as an
int64 slot (pointers and integers as they are, doubles by their bits) and runs all its
calls in one ctypes call of ``qp_run_plan``. Each kernel then needs a C wrapper that
unpacks its slots: :func:`source` writes them from the kernels' ctypes signatures
(``simulator.runtime.native.SIGNATURES``, the one statement of each kernel's arguments), and
``simulator.runtime.native.build`` compiles them with the kernels. This module imports nothing of
the simulator, so native.py can use it.
"""

from __future__ import annotations

import ctypes
import struct

RUNNER = "qp_run_plan"
FAST_RUNNER = "qp_run_np"  # qp_run_plan from numpy inputs: checks, threads, wake-up
CHUNK_RUNNER = "qp_run_chunks"  # a batch split's chunks, several plans on the pool
BATCH_RUNNER = "qp_run_batch_np"  # qp_run_chunks from the batch's numpy inputs
RUNNERS = (RUNNER, FAST_RUNNER, CHUNK_RUNNER, BATCH_RUNNER)
_C_TYPES = {ctypes.c_void_p: "const void *", ctypes.c_int64: "int64_t", ctypes.c_double: "double"}
_UNPACK = {ctypes.c_void_p: "(const void *)a[{}]", ctypes.c_int64: "a[{}]",
           ctypes.c_double: "d_(a[{}])"}  # fmt: skip


def names(signatures: dict) -> tuple[str, ...]:
    """The kernels with a wrapper, in the order of the C table ``qp_packed``."""
    return tuple(n for n in signatures if n not in RUNNERS)


def source(signatures: dict) -> str:
    """C source: a declaration and a wrapper ``int64_t w_<kernel>(const int64_t *a)`` per
    kernel (its return value, 0 for a void kernel), and the table ``qp_packed``."""
    out = ["#include <stdint.h>", "#include <string.h>",
           "static double d_(int64_t v) { double d; memcpy(&d, &v, 8); return d; }"]  # fmt: skip
    for name in names(signatures):
        args, res = signatures[name]
        ret = "int" if res is ctypes.c_int else "void"
        params = ", ".join(_C_TYPES[a] for a in args) or "void"
        call = f"{name}({', '.join(_UNPACK[a].format(i) for i, a in enumerate(args))})"
        body = f"return {call};" if ret == "int" else f"{call}; return 0;"
        out += [f"{ret} {name}({params});",
                f"static int64_t w_{name}(const int64_t *a) {{ (void)a; {body} }}"]  # fmt: skip
    table = ", ".join(f"w_{n}" for n in names(signatures))
    out.append(f"int64_t (*const qp_packed[])(const int64_t *) = {{{table}}};")
    return "\n".join(out) + "\n"


def slot(ctype, value) -> int:
    """One argument of ctypes type ``ctype`` as an int64 slot: a double by its bits, a
    pointer's address (an int, a ``c_void_p``, a ctypes array, which the caller keeps
    alive; None: 0), an integer as it is."""
    if ctype is ctypes.c_double:
        return struct.unpack("<q", struct.pack("<d", float(value)))[0]
    if isinstance(value, ctypes.Array):
        return ctypes.addressof(value)
    if isinstance(value, ctypes.c_void_p):
        value = value.value
    return 0 if value is None else int(value)
