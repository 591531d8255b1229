"""Fuzz targets: the spec loader, the .hbm loader (headers with a valid checksum) and the
ONNX importers (OnnxRunner, the converter). Each target takes fuzz input and must either
succeed or raise one of our own errors (:class:`schemas.errors.QparityError`); anything
else is a crash. Used by tests/fuzz/test_fuzz.py (short) and bench/fuzz.py (bounded).
"""

from __future__ import annotations

import copy
import random
import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st

from schemas.errors import QparityError
from schemas.spec import parse_spec
from tests.conftest import tiny_spec_dict

SECTIONS = ["name", "model", "data", "quant", "stages", "compare", "tags", "faults", "pipeline"]
KEYS = SECTIONS + ["factory", "dataset", "march", "consistency_level", "run", "stop_after",
                   "batch_size", "overrides", "kind", "layer", "samples", "enabled", "x"]  # fmt: skip
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["int8", "int16", "nash-e", "convert", "2", "none"]),
)  # fmt: skip
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=20,
)


@st.composite
def spec_data(draw):
    """A valid tiny spec with random sections replaced or added, or pure noise."""
    if draw(st.booleans()):
        return draw(values)
    data = copy.deepcopy(tiny_spec_dict())
    for key in draw(st.lists(st.sampled_from(SECTIONS), max_size=3)):
        data[key] = draw(values)
    return data


def spec_target(data) -> None:
    parse_spec(data, "fuzz.yaml")


def hbm_target(header_edit: tuple[int, object], program) -> None:
    """Replace one header value (by position in a flat walk) and load the file."""
    from simulator.program import hbm
    from simulator.runtime.executor import Executor

    header, blob = hbm._header(program)
    _replace_nth(header, *header_edit)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.hbm"
        path.write_bytes(hbm.pack(header, blob))
        loaded = hbm.load(path)
        Executor(loaded)


def _replace_nth(node, n: int, value, counter=None) -> int:
    """Replace the ``n``-th leaf of a JSON-like tree (depth first) with ``value``."""
    counter = [0] if counter is None else counter
    items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
    for key, child in items:
        if isinstance(child, (dict, list)) and child:
            _replace_nth(child, n, value, counter)
        else:
            if counter[0] == n:
                node[key] = value
            counter[0] += 1
    return counter[0]


def mutate_onnx(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """One random structural edit: op type, an input dropped or renamed, an attribute, a
    node removed, an initializer's values or shape changed."""
    rng = random.Random(seed)
    m = copy.deepcopy(model)
    nodes = m.graph.node
    node = nodes[rng.randrange(len(nodes))]
    kind = rng.randrange(6)
    if kind == 0:
        node.op_type = rng.choice(["Conv", "Add", "Relu", "QuantizeLinear", "Lut", "Nope"])
    elif kind == 1 and node.input:
        del node.input[rng.randrange(len(node.input))]
    elif kind == 2 and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(["", "missing", node.output[0]])
    elif kind == 3 and node.attribute:
        a = node.attribute[rng.randrange(len(node.attribute))]
        a.CopyFrom(onnx.helper.make_attribute(a.name, rng.choice([0, -3, 2.5, "x", [1, 2]])))
    elif kind == 4:
        nodes.remove(node)
    elif m.graph.initializer:
        init = m.graph.initializer[rng.randrange(len(m.graph.initializer))]
        arr = onnx.numpy_helper.to_array(init)
        arr = rng.choice([np.zeros_like(arr), -arr, arr.reshape(-1)[: max(arr.size // 2, 1)]])
        init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(arr), init.name))
    return m


def onnx_target(model: onnx.ModelProto, x: np.ndarray) -> None:
    """Load and run a (mutated) qat.onnx, then convert it."""
    from stages.convert.graph import Converter, ConvertSettings
    from stages.onnx_runner import OnnxRunner

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        onnx.save(model, str(path))
        OnnxRunner(path).run(x)
    Converter(model, ConvertSettings()).run()


def outcome(fn, *args) -> str:
    """'ok', 'ours' (one of our errors) or 'CRASH <type>: <message>'."""
    try:
        fn(*args)
    except QparityError:
        return "ours"
    except Exception as e:  # the point of fuzzing: anything else is a finding
        return f"CRASH {type(e).__name__}: {str(e)[:200]}"
    return "ok"
