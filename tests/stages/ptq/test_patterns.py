"""optimized: exporters' LayerNorm, GELU and hardswish idioms fuse into one op with the
same outputs; a partly matched idiom stays as it was and says which node broke it
(stages/ptq/patterns.py)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from stages.ptq import equivalence
from stages.ptq.optimize import optimize

D = 8
RNG = np.random.default_rng(0)


class G:
    """A graph x[2, 4, D] -> ... written node by node; constants become initializers."""

    def __init__(self):
        self.nodes, self.inits, self.k = [], {}, 0

    def c(self, value) -> str:
        self.k += 1
        self.inits[f"c{self.k}"] = np.asarray(value, np.float32)
        return f"c{self.k}"

    def op(self, op: str, *inputs: str, **attrs) -> str:
        out = f"{op.lower()}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def model(self, y: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, D])],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", 4, D])],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()],
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ln(g: G, x: str, pow_exp=2.0, var_axes=(-1,), square="pow", divide="div",
        gamma_shape=(D,)) -> str:  # fmt: skip
    """torch's decomposed LayerNorm over the last axis (tf2onnx: ``square="mul"``,
    ``divide="reciprocal"``, gamma [1, 1, D])."""
    d = g.op("Sub", x, g.op("ReduceMean", x, axes=[-1]))
    sq = g.op("Pow", d, g.c(pow_exp)) if square == "pow" else g.op("Mul", d, d)
    std = g.op("Sqrt", g.op("Add", g.op("ReduceMean", sq, axes=list(var_axes)), g.c(1e-5)))
    y = g.op("Div", d, std) if divide == "div" else g.op("Mul", d, g.op("Reciprocal", std))
    y = g.op("Mul", y, g.c(RNG.uniform(0.5, 1.5, gamma_shape)))
    return g.op("Add", g.c(RNG.normal(0, 0.2, D)), y)


def layernorm(**kw) -> onnx.ModelProto:
    g = G()
    return g.model(_ln(g, "x", **kw))


def gelu(order: str, divisor: float = math.sqrt(2)) -> onnx.ModelProto:
    g = G()
    if order == "torch":  # (x * (erf(x / sqrt 2) + 1)) * 0.5
        s = g.op("Add", g.op("Erf", g.op("Div", "x", g.c(divisor))), g.c(1.0))
        return g.model(g.op("Mul", g.op("Mul", "x", s), g.c(0.5)))
    s = g.op("Add", g.c(1.0), g.op("Erf", g.op("Mul", "x", g.c(1 / divisor))))
    if order == "half_first":  # (s * 0.5) * x
        return g.model(g.op("Mul", g.op("Mul", s, g.c(0.5)), "x"))
    return g.model(g.op("Mul", g.op("Mul", g.c(0.5), "x"), s))  # tf2onnx: (0.5 * x) * s


def gelu_tanh(cube: str = "pow", kappa: float = 0.044715) -> onnx.ModelProto:
    """torch's tanh GELU below opset 20 (``cube="mul"``: x * (x * x)) and HF's NewGELU
    (``Pow(x, 3)``)."""
    g = G()
    x3 = g.op("Pow", "x", g.c(3.0)) if cube == "pow" else g.op("Mul", "x", g.op("Mul", "x", "x"))
    inner = g.op("Add", "x", g.op("Mul", g.c(kappa), x3))
    t = g.op("Tanh", g.op("Mul", g.c(math.sqrt(2 / math.pi)), inner))
    return g.model(g.op("Mul", g.c(0.5), g.op("Mul", "x", g.op("Add", g.c(1.0), t))))


def hardswish(form: str, clip_max: float = 6.0, alpha: float = 0.1666667) -> onnx.ModelProto:
    g = G()
    if form == "hardsigmoid":
        return g.model(g.op("Mul", "x", g.op("HardSigmoid", "x", alpha=alpha, beta=0.5)))
    clip = g.op("Clip", g.op("Add", "x", g.c(3.0)), g.c(0.0), g.c(clip_max))
    if form == "paddle":  # (x * clip) / 6
        return g.model(g.op("Div", g.op("Mul", "x", clip), g.c(6.0)))
    if form == "div_first":  # x * (clip / 6)
        return g.model(g.op("Mul", "x", g.op("Div", clip, g.c(6.0))))
    return g.model(g.op("Mul", g.op("Mul", clip, g.c(1 / 6)), "x"))  # (clip * 1/6) * x


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


X = (RNG.standard_normal((3, 4, D)) * 3).astype(np.float32)
FUSED = {
    "ln torch": (layernorm(), "LayerNormalization"),
    "ln tf2onnx": (layernorm(square="mul", divide="reciprocal", gamma_shape=(1, 1, D)),
                   "LayerNormalization"),
    "gelu torch": (gelu("torch"), "Gelu"),
    "gelu tf2onnx": (gelu("tf2onnx"), "Gelu"),
    "gelu half first": (gelu("half_first"), "Gelu"),
    "gelu tanh pow": (gelu_tanh(), "Gelu"),
    "gelu tanh mul": (gelu_tanh(cube="mul"), "Gelu"),
    "hardswish paddle": (hardswish("paddle"), "HardSwish"),
    "hardswish times 1/6": (hardswish("sixth"), "HardSwish"),
    "hardswish divided first": (hardswish("div_first"), "HardSwish"),
    "hardswish hardsigmoid": (hardswish("hardsigmoid"), "HardSwish"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(FUSED))
def test_an_idiom_fuses_into_one_op_with_the_same_outputs(case):
    model, op = FUSED[case]
    found = []
    out, removed = optimize(model, found)
    assert [n.op_type for n in out.graph.node] == [op]
    assert len(found) == 1 and found[0] and found[0].op == op
    assert found[0].nodes[0] == model.graph.node[0].name  # the fused node keeps the first id
    assert set(removed) >= set(found[0].nodes[1:])
    np.testing.assert_allclose(run(out, X), run(model, X), rtol=1e-5, atol=1e-5)


PARTIAL = {
    "Pow exponent 3": (layernorm(pow_exp=3.0), "node pow2: Pow exponent 3, expected 2"),
    "variance axes": (layernorm(var_axes=(-2, -1)),
                      "node reducemean3: ReduceMean axes [-2, -1], expected [-1] (the mean's)"),
    "gelu divisor 2": (gelu("torch", divisor=2.0), "node div0: Div divisor 2, expected 1.41421"),
    "gelu tanh kappa": (gelu_tanh(kappa=0.05),
                        "node add2: adds no 0.044715 * x^3 to x"),
    "hardswish clip max 5": (hardswish("paddle", clip_max=5.0), "node clip1: Clip max 5.0, expected 6"),
    "hardsigmoid alpha 0.2": (hardswish("hardsigmoid", alpha=0.2),
                              "node hardsigmoid0: HardSigmoid alpha 0.2, expected 0.166667"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(PARTIAL))
def test_a_partly_matched_idiom_names_the_node_that_broke_it_and_stays(case):
    model, why = PARTIAL[case]
    found = []
    out, _ = optimize(model, found)
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
    assert len(found) == 1 and not found[0] and found[0].broken == why
    np.testing.assert_array_equal(run(out, X), run(model, X))


def test_the_equivalence_report_lists_each_instance_with_its_cosine():
    g = G()
    model = g.model(_ln(g, _ln(g, "x"), var_axes=(-2, -1)))  # fused, then partly matched
    found = []
    out, removed = optimize(model, found)
    rows = equivalence.compare_layers(model, out, X, removed)
    lines = equivalence.render_rows(rows, 0.999, found).splitlines()
    assert "add8 | Add | 1.000000 | now written by LayerNormalization reducemean0" in lines
    assert lines[2].startswith("reducemean0 | ReduceMean | - | fused: its output is now add8")
    k = lines.index("# patterns fused (1): pattern | new node | nodes replaced | cosine")
    assert lines[k + 1] == (
        "layernorm | LayerNormalization reducemean0 | reducemean0, sub1, pow2, reducemean3, "
        "add4, sqrt5, div6, mul7, add8 | 1.000000"
    )
    assert lines[k + 2].startswith("# patterns partly matched, left unfused (1)")
    assert lines[k + 3] == (
        "layernorm | reducemean9, sub10, pow11, reducemean12 | node reducemean12: ReduceMean "
        "axes [-2, -1], expected [-1] (the mean's)"
    )


def test_a_constant_first_operand_moves_second():
    """torch's TorchScript exporter writes a linear's bias first (``Add(bias, MatMul)``);
    convert takes a constant only as input 1 (else the add became a float island)."""
    g = G()
    y = g.op("Add", g.c(RNG.normal(0, 1, D)), g.op("Mul", g.c(2.0), "x"))
    model = g.model(y)
    out, _ = optimize(model)
    inits = {i.name for i in out.graph.initializer}
    assert [(n.input[0] in inits, n.input[1] in inits) for n in out.graph.node] == [
        (False, True)
    ] * 2
    np.testing.assert_array_equal(run(out, X), run(model, X))
