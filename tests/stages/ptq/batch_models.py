"""Small onnx.helper graphs whose sizes follow the batch, on tests.models' x[N, 1, 8, 8]:
as the dynamo exporter writes them with a dynamic batch (``Shape`` subgraphs), or with
the batch fixed at a number (constants that carry it)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DYNAMIC = "N"


def _node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def _model(nodes, name, batch, out_shape, inits, opset=18) -> onnx.ModelProto:
    arrays = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, *out_shape])],
        arrays,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _floats(rng, shape, sd):
    return rng.normal(0, sd, shape).astype(np.float32)


def _ints(v):
    return np.asarray(v, np.int64)


def class_token(batch: int | str = DYNAMIC) -> onnx.ModelProto:
    """A ViT in small: Conv patches [B,4,2,2] -> Reshape [B,4,4] -> Transpose -> Concat with
    the class token expanded to [B,1,4] -> + position -> * 0.5 -> MatMul -> Relu -> token 0 ->
    MatMul [B,10]. Dynamic: the token's target is ``Concat(Shape(x)[0:1], 1, 4)``; fixed:
    the exporter's constants (``[b, 4, 4]``, the token expanded to ``[b, 1, 4]``)."""
    rng = np.random.default_rng(0)
    inits = {"w": _floats(rng, (4, 1, 4, 4), 0.3), "cls": _floats(rng, (1, 1, 4), 0.5),
             "pos": _floats(rng, (1, 5, 4), 0.1), "wq": _floats(rng, (4, 4), 0.5),
             "fc": _floats(rng, (4, 10), 0.3), "zero": _ints(0),
             "half": np.asarray([0.5], np.float32)}  # fmt: skip
    nodes = [_node("Conv", ["x", "w"], ["c"], strides=[4, 4])]
    if batch == DYNAMIC:
        inits.update(tok=_ints([0, 4, 4]), s0=_ints([0]), s1=_ints([1]), d=_ints([1, 4]))
        nodes += [_node("Shape", ["x"], ["shape"]), _node("Slice", ["shape", "s0", "s1"], ["b"]),
                  _node("Concat", ["b", "d"], ["target"], axis=0)]  # fmt: skip
    else:
        inits.update(tok=_ints([batch, 4, 4]), target=_ints([batch, 1, 4]))
    nodes += [
        _node("Reshape", ["c", "tok"], ["t"]),
        _node("Transpose", ["t"], ["tt"], perm=[0, 2, 1]),
        _node("Expand", ["cls", "target"], ["ce"]),
        _node("Concat", ["ce", "tt"], ["seq"], axis=1),
        _node("Add", ["seq", "pos"], ["p"]),
        _node("Mul", ["p", "half"], ["ph"]),  # a scale of shape [1], as the exporter writes
        _node("MatMul", ["ph", "wq"], ["q"]),
        _node("Relu", ["q"], ["r"]),
        _node("Gather", ["r", "zero"], ["g"], axis=1),
        _node("MatMul", ["g", "fc"], ["y"]),
    ]
    return _model(nodes, "class_token", batch, [10], inits)


def upsample(batch: int | str = DYNAMIC, opset: int = 18) -> onnx.ModelProto:
    """A segmentation head in small: Conv [B,3,4,4] (stride 2) -> Resize (linear) to
    [B,3,8,8]; the sizes ``Concat(Shape(c)[0:2], [8, 8])`` (dynamic) or ``[b, 3, 8, 8]``."""
    rng = np.random.default_rng(1)
    inits = {"w": _floats(rng, (3, 1, 3, 3), 0.3), "hw": _ints([8, 8])}
    nodes = [_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1])]
    if batch == DYNAMIC:
        nodes += [_node("Shape", ["c"], ["shape"], start=0, end=2),
                  _node("Concat", ["shape", "hw"], ["sizes"], axis=0)]  # fmt: skip
    else:
        inits["sizes"] = _ints([batch, 3, 8, 8])
    nodes.append(_node("Resize", ["c", "", "", "sizes"], ["y"], mode="linear"))
    return _model(nodes, "upsample", batch, [3, 8, 8], inits, opset)


def windows(rest: tuple = (4, 4, 4)) -> onnx.ModelProto:
    """Swin/MobileViT-style windows: Conv [B,4,8,8] -> Reshape to [4B, 4, 4, 4] with the
    first entry ``Shape(c)[0] * 4`` (then ``rest``) -> ReduceMean -> Reshape [B, 64] ->
    MatMul [B, 10]."""
    rng = np.random.default_rng(2)
    inits = {"w": _floats(rng, (4, 1, 3, 3), 0.3), "zero": _ints(0), "four": _ints(4),
             "rest": _ints(list(rest)), "ax": _ints([0]), "flat": _ints([-1, 64]),
             "fc": _floats(rng, (64, 10), 0.3)}  # fmt: skip
    nodes = [
        _node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        _node("Shape", ["c"], ["shape"]),
        _node("Gather", ["shape", "zero"], ["b"]),
        _node("Mul", ["b", "four"], ["b4"]),
        _node("Unsqueeze", ["b4", "ax"], ["b4_1d"]),
        _node("Concat", ["b4_1d", "rest"], ["target"], axis=0),
        _node("Reshape", ["c", "target"], ["win"]),
        _node("ReduceMean", ["win"], ["m"], axes=[3], keepdims=0),
        _node("Reshape", ["m", "flat"], ["f"]),
        _node("MatMul", ["f", "fc"], ["y"]),
    ]
    return _model(nodes, "windows", DYNAMIC, [10], inits, opset=17)


def strided(batch: int = 1) -> onnx.ModelProto:
    """An ``as_strided`` as the dynamo exporter writes it at a fixed batch: Conv [b,4,8,8]
    -> GlobalAveragePool -> Reshape to the flat [4b] -> Gather of every element in order
    to [b,4,1,1] -> Flatten -> MatMul [b,10]."""
    rng = np.random.default_rng(3)
    inits = {"w": _floats(rng, (4, 1, 3, 3), 0.3), "flat": _ints([4 * batch]),
             "idx": _ints(np.arange(4 * batch).reshape(batch, 4, 1, 1)),
             "fc": _floats(rng, (4, 10), 0.3)}  # fmt: skip
    nodes = [
        _node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        _node("GlobalAveragePool", ["c"], ["p"]),
        _node("Reshape", ["p", "flat"], ["f"]),
        _node("Gather", ["f", "idx"], ["s"], axis=0),
        _node("Flatten", ["s"], ["v"]),
        _node("MatMul", ["v", "fc"], ["y"]),
    ]
    return _model(nodes, "strided", batch, [10], inits)


def first_frame() -> onnx.ModelProto:
    """Batch fixed at 1 and a Gather of frame 0 (``x[0]``): no other batch fits."""
    rng = np.random.default_rng(4)
    inits = {"w": _floats(rng, (4, 1, 3, 3), 0.3), "zero": _ints(0), "flat": _ints([1, 256]),
             "fc": _floats(rng, (256, 10), 0.3)}  # fmt: skip
    nodes = [
        _node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        _node("Gather", ["c", "zero"], ["frame0"], axis=0),
        _node("Reshape", ["frame0", "flat"], ["f"]),
        _node("MatMul", ["f", "fc"], ["y"]),
    ]
    return _model(nodes, "first_frame", 1, [10], inits)


def two_inputs(bx: int | str = 1, bm: int | str = 1) -> onnx.ModelProto:
    """Two inputs whose dim 0 the exporter fixed (``bx``, ``bm``): x [bx,1,8,8] -> Conv
    (stride 4) -> Reshape to the constant [bx, 16] -> MatMul [16,4] -> + m [bm,4] -> y
    (its dim 0 dynamic when they differ: the Add broadcasts [1, 4] to [2, 4])."""
    rng = np.random.default_rng(5)
    b = next((d for d in (bx, bm) if isinstance(d, int)), -1)  # -1: both dynamic
    inits = {"w": _floats(rng, (4, 1, 3, 3), 0.3), "flat": _ints([b, 16]),
             "fc": _floats(rng, (16, 4), 0.3)}  # fmt: skip
    nodes = [
        _node("Conv", ["x", "w"], ["c"], strides=[4, 4], pads=[1, 1, 1, 1]),
        _node("Reshape", ["c", "flat"], ["f"]),
        _node("MatMul", ["f", "fc"], ["g"]),
        _node("Add", ["g", "m"], ["y"]),
    ]
    arrays = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    graph = helper.make_graph(
        nodes, "two_inputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [bx, 1, 8, 8]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [bm, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b if b > 0 and bx == bm else "N", 4])],
        arrays,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
