"""The ``.hbm`` program file: save, load and pack a :class:`Program` (its readable
listing is :mod:`simulator.program.hbm_render`).

File layout (all integers little-endian)::

    offset 0   b"QHBM"                      magic
    offset 4   u16  format version          isa.HBM_VERSION
    offset 6   u32  header length H         bytes of header JSON (space-padded)
    offset 10  header JSON, UTF-8           march, inputs, outputs, instructions [op,
                                            inputs, outputs, consts, attrs, layer_ids],
                                            layouts, captures, blob_nbytes, constants:
                                            name -> {offset, nbytes, dtype, shape}
    10 + H     constant blob                each constant C-order little-endian bytes at a
                                            64-byte aligned offset (relative to the blob,
                                            which itself starts 64-byte aligned in the file),
                                            in order of first use by instructions, then
                                            unused constants; zero padding between
    end - 32   sha256 of every byte before it

JSON has no tuples, so tuples inside ``attrs``/``inputs``/``outputs`` are tagged
``{"__tuple__": [...]}`` and come back as tuples; numpy scalars are stored as Python
numbers. ``load`` checks magic, version, length, checksum, then the header's consistency,
and refuses anything else with a :class:`SimulatorError` naming the file and what to do.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import numpy as np

from schemas.errors import SimulatorError
from schemas.fileio import atomic_write_bytes
from simulator.program.isa import HBM_VERSION, Instruction, Layout, Op, Program

MAGIC = b"QHBM"
ALIGN = 64
DIGEST = 32
_PRE = struct.Struct("<4sHI")  # magic, version, header length
_INTS = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16")
DTYPES = (*_INTS, "float16", "float32", "float64")
"""The constant dtypes .hbm stores."""
_TUPLE = "__tuple__"
_RECOMPILE = "recompile the model (run the compile stage again) to rewrite the file"


def _pad(n: int) -> int:
    return -n % ALIGN


# -- JSON values --------------------------------------------------------------------------


def _to_json(v, where: str):
    """A JSON-able copy of ``v`` with tuples tagged; SimulatorError on anything else."""
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return {_TUPLE: [_to_json(x, where) for x in v]}
    if isinstance(v, list):
        return [_to_json(x, where) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v) and set(v) != {_TUPLE}:
        return {k: _to_json(x, f"{where}.{k}") for k, x in v.items()}
    raise SimulatorError(
        f"{where} holds {type(v).__name__} {v!r:.60}, which .hbm cannot store",
        hint="keep attrs to numbers, strings, lists, tuples and str-keyed "
        "dicts; put arrays in the constant pool",
    )


def _from_json(v):
    """Undo :func:`_to_json`."""
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    if isinstance(v, dict):
        if set(v) == {_TUPLE} and isinstance(v[_TUPLE], list):
            return tuple(_from_json(x) for x in v[_TUPLE])
        return {k: _from_json(x) for k, x in v.items()}
    return v


# -- save ----------------------------------------------------------------------------------


def _const_order(program: Program) -> list[str]:
    """Constant names in order of first use by instructions, then the unused ones."""
    order = dict.fromkeys(c for ins in program.instructions for c in ins.consts)
    missing = [c for c in order if c not in program.constants]
    if missing:
        raise SimulatorError(
            f"instructions use constants {missing[:5]} that the program lacks",
            hint="a compiler bug: every const name must be in constants",
        )
    return [*order, *(c for c in program.constants if c not in order)]


def _pack_constants(program: Program) -> tuple[dict, bytes]:
    """The constant table (in the program's order) and the aligned blob (in use order)."""
    table, chunks, offset = {}, [], 0
    for name in _const_order(program):
        a = np.asarray(program.constants[name])
        if a.dtype.name not in DTYPES:
            raise SimulatorError(
                f"constant {name!r} has dtype {a.dtype}, which .hbm cannot store",
                hint=f"use one of {', '.join(DTYPES)}",
            )
        raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
        table[name] = {
            "offset": offset,
            "nbytes": len(raw),
            "dtype": a.dtype.name,
            "shape": list(a.shape),
        }
        chunks += [raw, b"\0" * _pad(len(raw))]
        offset += len(raw) + _pad(len(raw))
    return {n: table[n] for n in program.constants}, b"".join(chunks)  # keep dict order


def _instruction_json(i: int, ins: Instruction) -> dict:
    return {
        "op": Op(ins.op).value,
        "inputs": list(ins.inputs),
        "outputs": list(ins.outputs),
        "consts": list(ins.consts),
        "attrs": _to_json(ins.attrs, f"instruction {i} attrs"),
        "layer_ids": list(ins.layer_ids),
    }


def _header(program: Program) -> tuple[dict, bytes]:
    """The header dict and the constant blob of ``program``."""
    table, blob = _pack_constants(program)
    header = {
        "march": program.march,
        "inputs": _to_json(program.inputs, "inputs"),
        "outputs": _to_json(program.outputs, "outputs"),
        "instructions": [_instruction_json(i, x) for i, x in enumerate(program.instructions)],
        "layouts": {
            b: [lay.kind, lay.channels, lay.channels_padded] for b, lay in program.layouts.items()
        },
        "captures": dict(program.captures),
        "blob_nbytes": len(blob),
        "constants": table,
    }
    return header, blob


def pack(header: dict, blob: bytes, version: int = HBM_VERSION) -> bytes:
    """The file bytes for a header dict and a blob (the header is padded so the blob
    starts 64-byte aligned), checksum appended. Public for tests that craft bad files."""
    text = json.dumps(header, separators=(",", ":"), allow_nan=True).encode("utf-8")
    text += b" " * _pad(_PRE.size + len(text))
    body = _PRE.pack(MAGIC, version, len(text)) + text + blob
    return body + hashlib.sha256(body).digest()


def save(program: Program, path: str | Path) -> None:
    """Write ``program`` to ``path`` atomically (temp file + rename)."""
    header, blob = _header(program)
    atomic_write_bytes(path, pack(header, blob))


# -- load ----------------------------------------------------------------------------------


def _fail(path, what: str, hint: str = _RECOMPILE) -> SimulatorError:
    return SimulatorError(what, where=str(path), hint=hint)


def _preamble(path, data: bytes) -> int:
    """Check magic and version; return the header length."""
    if len(data) < len(MAGIC) and MAGIC.startswith(data):
        raise _fail(path, f"the file is truncated ({len(data)} bytes, an empty or cut .hbm)")
    if data[: len(MAGIC)] != MAGIC:
        raise _fail(
            path,
            f"not a .hbm file (magic {data[:4]!r}, expected {MAGIC!r})",
            hint="pass a .hbm file written by the compile stage",
        )
    if len(data) < _PRE.size + DIGEST:
        raise _fail(path, f"the file is truncated ({len(data)} bytes, less than a bare .hbm)")
    _, version, hlen = _PRE.unpack_from(data)
    if version != HBM_VERSION:
        raise _fail(
            path,
            f".hbm format version {version} is not supported (this qparity "
            f"reads version {HBM_VERSION})",
            hint=f"recompile with this qparity, or use the qparity that wrote v{version}",
        )
    if len(data) < (need := _PRE.size + hlen + DIGEST):
        raise _fail(path, f"the file is truncated ({len(data)} bytes, its header needs {need})")
    return hlen


def _parse_header(data: bytes, hlen: int) -> dict:
    header = json.loads(data[_PRE.size : _PRE.size + hlen].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return header


def _check_digest(path, data: bytes, hlen: int) -> None:
    """Checksum; when it fails, say truncated if the header's sizes explain it."""
    if hashlib.sha256(data[:-DIGEST]).digest() == data[-DIGEST:]:
        return
    try:
        need = _PRE.size + hlen + int(_parse_header(data, hlen)["blob_nbytes"]) + DIGEST
    except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
        need = len(data)
    if len(data) < need:
        raise _fail(path, f"the file is truncated ({len(data)} bytes, its header says {need})")
    raise _fail(path, "checksum mismatch: the file is corrupted (its sha256 differs)")


def _strs(v, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ValueError(f"{what} is not a list of strings")
    return tuple(v)


def _constant(name: str, e: dict, blob: bytes) -> np.ndarray:
    """One constant from its table entry, every field checked against the blob."""
    off, n, dtype, shape = e["offset"], e["nbytes"], e["dtype"], e["shape"]
    if dtype not in DTYPES:
        raise ValueError(f"constant {name!r} has unknown dtype {dtype!r}")
    if not all(isinstance(x, int) and x >= 0 for x in (off, n, *shape)):
        raise ValueError(f"constant {name!r} has a bad offset, size or shape")
    dt = np.dtype(dtype).newbyteorder("<")
    if off % ALIGN or off + n > len(blob) or n != math.prod(shape) * dt.itemsize:
        raise ValueError(
            f"constant {name!r} (offset {off}, {n} bytes, {dtype} {shape}) does "
            f"not fit the {len(blob)}-byte blob or its own shape"
        )
    return np.frombuffer(blob, dt, math.prod(shape), off).reshape(shape).astype(dtype)


def _instruction(i: int, d: dict, consts: dict) -> Instruction:
    if d["op"] not in Op._value2member_map_:
        raise SimulatorError(
            f"instruction {i} has unknown op {d['op']!r} (known: {', '.join(o.value for o in Op)})",
            hint="the file was written by another qparity version; " + _RECOMPILE,
        )
    names = _strs(d["consts"], f"instruction {i} consts")
    unknown = [c for c in names if c not in consts]
    if unknown or not isinstance(d["attrs"], dict):
        raise ValueError(
            f"instruction {i} uses constants {unknown} not in the table"
            if unknown
            else f"instruction {i} attrs is not an object"
        )
    return Instruction(
        Op(d["op"]),
        _strs(d["inputs"], f"instruction {i} inputs"),
        _strs(d["outputs"], f"instruction {i} outputs"),
        names,
        _from_json(d["attrs"]),
        _strs(d["layer_ids"], f"instruction {i} ids"),
    )


def _program(h: dict, blob: bytes) -> Program:
    """The Program a checked header and blob describe (KeyError/TypeError/ValueError if
    the header is inconsistent)."""
    if h["blob_nbytes"] != len(blob):
        raise ValueError(f"blob_nbytes {h['blob_nbytes']} but the blob is {len(blob)} bytes")
    consts = {n: _constant(n, e, blob) for n, e in h["constants"].items()}
    layouts = {b: Layout(str(k), int(c), int(p)) for b, (k, c, p) in h["layouts"].items()}
    caps = h["captures"]
    ins, outs = _from_json(h["inputs"]), _from_json(h["outputs"])
    if not all(isinstance(x, dict) for x in (caps, ins, outs)) or not all(
        isinstance(v, str) for v in caps.values()
    ):
        raise ValueError("inputs, outputs or captures is malformed")
    instrs = [_instruction(i, d, consts) for i, d in enumerate(h["instructions"])]
    return Program(str(h["march"]), ins, outs, instrs, consts, layouts, dict(caps))


def load(path: str | Path) -> Program:
    """Read a ``.hbm`` file; SimulatorError (naming the file and a fix) if it is not one,
    has another format version, is truncated, corrupted or inconsistent."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise _fail(
            path,
            f"cannot read the file ({e.strerror or e})",
            hint="check the path; compile writes model.hbm in the run folder",
        ) from e
    hlen = _preamble(path, data)
    _check_digest(path, data, hlen)
    try:
        header = _parse_header(data, hlen)
        return _program(header, data[_PRE.size + hlen : -DIGEST])
    except SimulatorError as e:
        raise _fail(path, e.what, e.hint or _RECOMPILE) from e
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError) as e:
        raise _fail(path, f"the header is inconsistent ({type(e).__name__}: {e})") from e
