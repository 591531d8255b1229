"""The .hbm format: bit-exact round trip, every refusal, and fuzzed corruption."""

from __future__ import annotations

import hashlib
import json
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import SimulatorError
from simulator.program import hbm, hbm_render
from simulator.program.isa import HBM_VERSION, Instruction, Layout, Op, Program


def small_program() -> Program:
    """Several ops and constants of every stored dtype, an unused one, odd shapes."""
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (16, 3, 3, 16), dtype=np.int8)
    consts = {
        "table": rng.integers(-32768, 32768, 256, dtype=np.int16),
        "w@packed": w,
        "bias@nhwc": rng.integers(-(2**31), 2**31, 16, dtype=np.int32),
        "mult@nhwc": rng.integers(0, 2**15, 16, dtype=np.int64),
        "shift": np.array(16, dtype=np.uint8),  # 0-d
        "unused": np.array([np.nan, -0.0, 1e-30, np.inf], dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.int8),
    }
    consts["unused"].view(np.uint32)[0] = 0x7FC00123  # a NaN payload must survive
    instrs = [
        Instruction(
            Op.QUANTIZE,
            ("x",),
            ("xq",),
            (),
            {"scale": [0.1], "axis": 1, "dtype": "int8", "rounding": "bpu_round"},
            ("quant",),
        ),
        Instruction(
            Op.LAYOUT, ("xq",), ("xq@nhwc",), (), {"op_type": "ToNHWC", "channels_padded": 16}
        ),
        Instruction(
            Op.CONV,
            ("xq@nhwc",),
            ("y",),
            ("w@packed", "bias@nhwc", "mult@nhwc", "shift"),
            {
                "strides": (1, 1),
                "pads": [1, 1, 1, 1],
                "relu": 1,
                "out_dtype": "int8",
                "nested": {"k": (2, [3, None]), "f": 0.5},
            },
            ("layer1.conv", "layer1.relu"),
        ),
        Instruction(Op.LUT, ("y",), ("z",), ("table",), {"in_dtype": "int16"}, ("act",)),
        Instruction(Op.DEQUANTIZE, ("z",), ("out",), (), {"scale": [0.02], "axis": 1}, ("dq",)),
    ]
    return Program(
        "nash-m",
        {"x": {"shape": [1, 3, 8, 8], "dtype": "float32", "format": "featuremap"}},
        {"out": {"dtype": "float32"}},
        instrs,
        consts,
        {"xq@nhwc": Layout("nhwc", 3, 16), "y": Layout("nhwc", 16, 16)},
        {"layer1.conv": "y", "act": "z"},
    )


def saved(tmp_path: Path, program: Program | None = None) -> Path:
    path = tmp_path / "model.hbm"
    hbm.save(program or small_program(), path)
    return path


def assert_same(a: Program, b: Program) -> None:
    assert (a.march, a.inputs, a.outputs, a.layouts, a.captures, a.version) == (
        b.march,
        b.inputs,
        b.outputs,
        b.layouts,
        b.captures,
        b.version,
    )
    assert a.instructions == b.instructions
    assert list(a.constants) == list(b.constants)
    for name, x in a.constants.items():
        y = b.constants[name]
        assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), name


def test_round_trip_is_exact(tmp_path):
    p = small_program()
    back = hbm.load(saved(tmp_path, p))
    assert_same(p, back)
    assert isinstance(back.instructions[2].attrs["strides"], tuple)
    assert back.instructions[2].attrs["nested"]["k"] == (2, [3, None])
    assert all(isinstance(i.op, Op) for i in back.instructions)
    assert back.constants["w@packed"].flags.writeable


def test_layout_magic_version_alignment_and_order(tmp_path):
    data = saved(tmp_path).read_bytes()
    magic, version, hlen = struct.unpack_from("<4sHI", data)
    assert (magic, version) == (b"QHBM", HBM_VERSION)
    assert (10 + hlen) % 64 == 0  # the blob starts aligned
    header = json.loads(data[10 : 10 + hlen])
    table = header["constants"]
    assert sorted(table, key=lambda n: table[n]["offset"]) == [
        "w@packed",
        "bias@nhwc",
        "mult@nhwc",
        "shift",
        "table",
        "unused",
        "empty",
    ]  # first use, then unused
    assert all(e["offset"] % 64 == 0 for e in table.values())
    assert len(data) == 10 + hlen + header["blob_nbytes"] + 32


def test_save_is_atomic_and_overwrites(tmp_path):
    path = saved(tmp_path)
    p = small_program()
    p.march = "nash-p"
    hbm.save(p, path)
    assert hbm.load(path).march == "nash-p"
    assert [f.name for f in tmp_path.iterdir()] == ["model.hbm"]


def test_save_refuses_what_it_cannot_store(tmp_path):
    p = small_program()
    p.instructions[0] = Instruction(Op.QUANTIZE, ("x",), ("xq",), (), {"s": np.ones(2)})
    with pytest.raises(SimulatorError, match="instruction 0 attrs.s holds ndarray"):
        hbm.save(p, tmp_path / "a.hbm")
    p = small_program()
    p.constants["c"] = np.ones(2, np.complex64)
    with pytest.raises(SimulatorError, match="complex64"):
        hbm.save(p, tmp_path / "b.hbm")
    p = small_program()
    del p.constants["table"]
    with pytest.raises(SimulatorError, match="lacks"):
        hbm.save(p, tmp_path / "c.hbm")
    assert not list(tmp_path.iterdir())


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x20
    path.write_bytes(bytes(data))


def test_bad_magic(tmp_path):
    path = tmp_path / "x.hbm"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(SimulatorError, match=r"x\.hbm: not a \.hbm file.*Fix"):
        hbm.load(path)


def test_wrong_version_says_which(tmp_path):
    header, blob = hbm._header(small_program())
    path = tmp_path / "v.hbm"
    path.write_bytes(hbm.pack(header, blob, version=HBM_VERSION + 1))
    msg = f"version {HBM_VERSION + 1} is not supported .*reads version {HBM_VERSION}"
    with pytest.raises(SimulatorError, match=msg):
        hbm.load(path)


@pytest.mark.parametrize("cut", [0, 2, 8, 11, 200, "blob", -33, -1])
def test_truncated(tmp_path, cut):
    path = saved(tmp_path)
    data = path.read_bytes()
    hlen = struct.unpack_from("<I", data, 6)[0]
    n = 10 + hlen + 100 if cut == "blob" else cut % len(data) if cut else 0
    path.write_bytes(data[:n])
    with pytest.raises(SimulatorError, match="v?.hbm: the file is truncated"):
        hbm.load(path)


@pytest.mark.parametrize("where", ["header", "blob", "checksum"])
def test_flipped_byte_is_corruption(tmp_path, where):
    path = saved(tmp_path)
    hlen = struct.unpack_from("<I", path.read_bytes(), 6)[0]
    _flip(path, {"header": 15, "blob": 10 + hlen + 70, "checksum": -5}[where])
    with pytest.raises(SimulatorError, match="checksum mismatch: the file is corrupted"):
        hbm.load(path)


def _crafted(tmp_path: Path, edit) -> Path:
    """A file with a valid checksum whose header ``edit`` made inconsistent."""
    header, blob = hbm._header(small_program())
    edit(header)
    path = tmp_path / "bad.hbm"
    path.write_bytes(hbm.pack(header, blob))
    return path


def test_unknown_op(tmp_path):
    path = _crafted(tmp_path, lambda h: h["instructions"][3].update(op="fft"))
    with pytest.raises(SimulatorError, match=r"bad\.hbm: instruction 3 has unknown op 'fft'"):
        hbm.load(path)


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h["constants"]["table"].update(shape=[257]),
        lambda h: h["constants"]["table"].update(offset=h["constants"]["table"]["offset"] + 1),
        lambda h: h["constants"]["shift"].update(dtype="complex64"),
        lambda h: h["instructions"][2].update(consts=["nope"]),
        lambda h: h["instructions"][0].update(inputs="x"),
        lambda h: h.update(blob_nbytes=h["blob_nbytes"] - 64),
        lambda h: h.pop("layouts"),
        lambda h: h.update(captures=[1]),
    ],
)
def test_inconsistent_header(tmp_path, edit):
    with pytest.raises(SimulatorError, match=r"bad\.hbm: the header is inconsistent"):
        hbm.load(_crafted(tmp_path, edit))


def test_header_not_json_with_valid_checksum(tmp_path):
    body = struct.pack("<4sHI", b"QHBM", HBM_VERSION, 5) + b"{nope"
    path = tmp_path / "j.hbm"
    path.write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(SimulatorError, match="header is inconsistent"):
        hbm.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(SimulatorError, match="cannot read the file"):
        hbm.load(tmp_path / "none.hbm")


def test_debug_map_and_render():
    p = small_program()
    assert hbm_render.debug_map(p)[2] == ("layer1.conv", "layer1.relu")
    assert hbm_render.debug_map(p)[1] == ()
    text = hbm_render.render(p)
    lines = text.splitlines()
    assert len(lines) == 1 + len(p.instructions)
    assert lines[3].startswith(
        "2 | conv | xq@nhwc -> y | w@packed, bias@nhwc, mult@nhwc, shift"
        " | layer1.conv, layer1.relu | strides=(1, 1)"
    )
    assert "(compiler)" in lines[2] and "nash-m" in lines[0]


GOOD = hbm.pack(*hbm._header(small_program()))


@settings(max_examples=200, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(1, 255)), max_size=3),
    cut=st.one_of(st.none(), st.integers(0, len(GOOD) - 1)),
)
def test_fuzzed_damage_only_raises_simulator_error(flips, cut):
    data = bytearray(GOOD)
    for pos, mask in flips:
        data[pos] ^= mask
    data = bytes(data[:cut] if cut is not None else data)
    if data == GOOD:
        return
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.hbm"
        path.write_bytes(data)
        with pytest.raises(SimulatorError):
            hbm.load(path)
