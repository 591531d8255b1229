"""ONNX graphs in the idioms of exporters other than torch's, written with onnx.helper.

Each builder returns a seeded float model as that exporter writes it:
- :func:`paddle_mobilenet` (paddle2onnx): a MobileNetV3 stem and block with hardswish as
  ``x * Clip(x + 3, 0, 6) / 6`` and a squeeze-excite gate ending in ``HardSigmoid``
  (alpha 0.1666667, beta 0.5), a ``Softmax`` classifier output;
- :func:`yolo_head` (ultralytics): a YOLOv8-style head on a dynamic batch, height and width:
  ``Split`` into box and class maps, the DFL (``Reshape`` to ``[N, 4, 16, HW]`` through
  ``Concat(Shape(x)[0:1], ...)``, ``Softmax`` over the 16 bins, a 1x1 ``Conv`` with
  ``0..15`` as weights), an anchor grid from ``Shape/Gather/Range/Cast``, ``Sigmoid``
  class scores, ``Concat`` of both; :func:`yolo_split` the same head with boxes and scores
  as two outputs;
- :func:`tf_nhwc` (tf2onnx): an NHWC input with ``Transpose`` around each conv, ``MatMul``
  + ``Add`` for dense layers and a LayerNorm written out as ReduceMean/Sub/Pow/ReduceMean/
  Add/Sqrt/Div/Mul/Add;
- :func:`bert` (torch's TorchScript exporter): a small BertModel, :mod:`examples.onnx_zoo.bert`;
  :func:`bert_mask` the same with its attention mask as a second float input, :func:`bert_ids`
  fed int64 token ids and that mask.
The weights are random (seeded); the chain is judged by agreement with the float model.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 32


class Graph:
    """Nodes, initializers and unique names for one builder."""

    def __init__(self, seed: int):
        self.rng, self.nodes, self.inits = np.random.default_rng(seed), [], {}

    def w(self, name: str, *shape: int, scale: float = 0.3) -> str:
        fan_in = int(np.prod(shape[1:])) or 1
        self.inits[name] = (self.rng.normal(0, scale, shape) / np.sqrt(fan_in) * 3).astype(
            np.float32
        )
        return name

    def c(self, name: str, value) -> str:
        self.inits[name] = np.asarray(value)
        return name

    def op(self, op: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> str:
        outs = [name] if n_out == 1 else [f"{name}:{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, x: list, y: str, y_shape: list, opset: int = 17) -> onnx.ModelProto:
        return self.multi({"x": x}, {y: y_shape}, opset)

    def multi(self, xs: dict, ys: dict, opset: int = 17) -> onnx.ModelProto:
        """The model with float inputs ``xs`` and outputs ``ys`` (name -> shape)."""
        graph = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in xs.items()],
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in ys.items()],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()],
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
        onnx.checker.check_model(m)
        return m


def _hardswish(g: Graph, x: str, name: str) -> str:
    """paddle2onnx's hardswish: ``x * Clip(x + 3, 0, 6) / 6``."""
    three, lo, hi = (
        g.c("three", np.float32(3)),
        g.c("zero", np.float32(0)),
        g.c("six", np.float32(6)),
    )
    clip = g.op("Clip", [g.op("Add", [x, three], f"{name}/add"), lo, hi], f"{name}/clip")
    return g.op("Div", [g.op("Mul", [x, clip], f"{name}/mul"), hi], f"{name}/div")


def paddle_mobilenet() -> onnx.ModelProto:
    g = Graph(1)
    x = g.op("Conv", ["x", g.w("stem.w", 16, 3, 3, 3), g.w("stem.b", 16)], "stem", pads=[1] * 4,
             strides=[2, 2])  # fmt: skip
    x = _hardswish(g, x, "stem.act")
    dw = g.op("Conv", [x, g.w("dw.w", 16, 1, 3, 3)], "dw", pads=[1] * 4, group=16)
    dw = g.op("Relu", [dw], "dw.relu")
    se = g.op("GlobalAveragePool", [dw], "se.pool")
    se = g.op("Relu", [g.op("Conv", [se, g.w("se.fc1.w", 4, 16, 1, 1)], "se.fc1")], "se.relu")
    se = g.op("Conv", [se, g.w("se.fc2.w", 16, 4, 1, 1)], "se.fc2")
    gate = g.op("HardSigmoid", [se], "se.gate", alpha=0.1666667, beta=0.5)
    x = g.op("Mul", [dw, gate], "se.scale")
    x = _hardswish(g, g.op("Conv", [x, g.w("pw.w", 24, 16, 1, 1)], "pw"), "pw.act")
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x], "pool")], "flatten")
    x = g.op("Gemm", [x, g.w("fc.w", 24, 10), g.w("fc.b", 10)], "fc")
    return g.model(["N", 3, SIZE, SIZE], g.op("Softmax", [x], "prob", axis=1), ["N", 10])


def yolo_head(classes: int = 3, bins: int = 16) -> onnx.ModelProto:
    g = Graph(2)
    dist, scores = _yolo(g, classes, bins)
    out = g.op("Concat", [dist, scores], "output", axis=1)
    return g.model(["N", 3, "H", "W"], out, ["N", 4 + classes, "HW"])


def yolo_split(classes: int = 3, bins: int = 16) -> onnx.ModelProto:
    """yolo_head with its box and class maps as two outputs (``boxes``, ``scores``), as
    ultralytics exports a head for an NMS outside the graph."""
    g = Graph(2)
    _yolo(g, classes, bins, ("boxes", "scores"))
    return g.multi({"x": ["N", 3, "H", "W"]},
                   {"boxes": ["N", 4, "HW"], "scores": ["N", classes, "HW"]})  # fmt: skip


def _yolo(g: Graph, classes: int, bins: int, names=("box.anchored", "cls.sigmoid")):
    """The YOLOv8 head's box distances (anchored) and class scores (module docstring),
    written to the tensors ``names``."""
    x = g.op("Conv", ["x", g.w("stem.w", 16, 3, 3, 3)], "stem", pads=[1] * 4, strides=[2, 2])
    x = g.op("Mul", [x, g.op("Sigmoid", [x], "stem.sig")], "stem.silu")  # SiLU as ultralytics
    head = g.op("Conv", [x, g.w("head.w", 4 * bins + classes, 16, 1, 1)], "head")
    box, cls = g.op("Split", [head, g.c("split", np.array([4 * bins, classes]))], "split",
                    n_out=2, axis=1)  # fmt: skip
    shape = g.op("Shape", [head], "shape")
    batch = g.op("Slice", [shape, g.c("s0", np.array([0])), g.c("s1", np.array([1]))], "batch")
    target = g.op("Concat", [batch, g.c("dfl.shape", np.array([4, bins, -1]))], "dfl.target",
                  axis=0)  # fmt: skip
    dfl = g.op("Softmax", [g.op("Reshape", [box, target], "dfl.reshape")], "dfl.softmax", axis=2)
    proj = g.c("dfl.proj", np.arange(bins, dtype=np.float32).reshape(1, bins, 1, 1))
    dfl = g.op("Conv", [g.op("Transpose", [dfl], "dfl.t", perm=[0, 2, 1, 3]), proj], "dfl.conv")
    dist = g.op("Reshape", [dfl, g.op("Concat", [batch, g.c("box.shape", np.array([4, -1]))],
                                      "box.target", axis=0)], "box")  # fmt: skip
    width = g.op("Gather", [shape, g.c("i3", np.array(3))], "width")
    height = g.op("Gather", [shape, g.c("i2", np.array(2))], "height")
    cells = g.op("Mul", [height, width], "cells")
    grid = g.op("Range", [g.c("r0", np.array(0)), cells, g.c("r1", np.array(1))], "grid")
    grid = g.op("Div", [g.op("Cast", [grid], "grid.f", to=TensorProto.FLOAT),
                        g.c("grid.scale", np.float32(SIZE))], "anchors")  # fmt: skip
    dist = g.op("Add", [dist, grid], names[0])
    flat_t = g.op("Concat", [batch, g.c("cls.shape", np.array([classes, -1]))], "cls.target",
                  axis=0)  # fmt: skip
    scores = g.op("Sigmoid", [g.op("Reshape", [cls, flat_t], "cls.reshape")], names[1])
    return dist, scores


def _layernorm(g: Graph, x: str, name: str, dim: int) -> str:
    """tf2onnx's LayerNorm, written out op by op over the last axis."""
    mean = g.op("ReduceMean", [x], f"{name}/mean", axes=[-1])  # opset 17: axes attribute
    d = g.op("Sub", [x, mean], f"{name}/sub")
    var = g.op("ReduceMean", [g.op("Pow", [d, g.c(f"{name}/two", np.float32(2))], f"{name}/pow")],
               f"{name}/var", axes=[-1])  # fmt: skip
    std = g.op("Sqrt", [g.op("Add", [var, g.c(f"{name}/eps", np.float32(1e-3))], f"{name}/add")],
               f"{name}/sqrt")  # fmt: skip
    y = g.op("Div", [d, std], f"{name}/div")
    y = g.op("Mul", [y, g.c(f"{name}/gamma", np.ones(dim, np.float32))], f"{name}/mul")
    return g.op("Add", [y, g.c(f"{name}/beta", np.zeros(dim, np.float32))], f"{name}/beta_add")


def tf_nhwc() -> onnx.ModelProto:
    g = Graph(3)
    x = g.op("Transpose", ["x"], "conv1/to_nchw", perm=[0, 3, 1, 2])
    x = g.op("Conv", [x, g.w("conv1.w", 8, 3, 3, 3), g.w("conv1.b", 8)], "conv1", pads=[1] * 4,
             strides=[2, 2])  # fmt: skip
    x = g.op("Transpose", [g.op("Relu", [x], "conv1/relu")], "conv1/to_nhwc", perm=[0, 2, 3, 1])
    x = g.op("Transpose", [x], "conv2/to_nchw", perm=[0, 3, 1, 2])
    x = g.op("Conv", [x, g.w("conv2.w", 8, 8, 3, 3)], "conv2", pads=[1] * 4, strides=[2, 2])
    x = g.op("Transpose", [g.op("Relu", [x], "conv2/relu")], "conv2/to_nhwc", perm=[0, 2, 3, 1])
    x = g.op("Reshape", [x, g.c("tokens.shape", np.array([-1, 64, 8]))], "tokens")
    x = _layernorm(g, x, "ln", 8)
    x = g.op("Add", [g.op("MatMul", [x, g.w("dense.w", 8, 8)], "dense"), g.w("dense.b", 8)],
             "dense/bias")  # fmt: skip
    x = g.op("ReduceMean", [x], "pool", axes=[1], keepdims=0)
    y = g.op("Add", [g.op("MatMul", [x, g.w("logits.w", 8, 10)], "logits"), g.w("logits.b", 10)],
             "logits/bias")  # fmt: skip
    return g.model(["N", SIZE, SIZE, 3], y, ["N", 10])


def bert() -> onnx.ModelProto:
    """A BERT encoder from torch's TorchScript exporter (:mod:`examples.onnx_zoo.bert`)."""
    from examples.onnx_zoo.bert import bert as export_bert

    return export_bert()


def bert_mask() -> onnx.ModelProto:
    """The BERT encoder with two float inputs: word embeddings ``x`` and the additive
    attention ``mask`` (:func:`examples.onnx_zoo.bert.bert_mask`)."""
    from examples.onnx_zoo.bert import bert_mask as export_bert_mask

    return export_bert_mask()


def bert_ids() -> onnx.ModelProto:
    """The BERT encoder fed int64 ``input_ids`` and the float ``mask``
    (:func:`examples.onnx_zoo.bert.bert_ids`)."""
    from examples.onnx_zoo.bert import bert_ids as export_bert_ids

    return export_bert_ids()


BUILDERS = {"paddle_mobilenet": paddle_mobilenet, "yolo_head": yolo_head, "tf_nhwc": tf_nhwc,
            "bert": bert, "yolo_split": yolo_split, "bert_mask": bert_mask,
            "bert_ids": bert_ids}  # fmt: skip
INPUT_SHAPES = {"yolo_head": {"x": [1, 3, SIZE, SIZE]}, "yolo_split": {"x": [1, 3, SIZE, SIZE]}}
"""``model.input_shapes`` a model needs (dynamic dims other than the batch)."""
