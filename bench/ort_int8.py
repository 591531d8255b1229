"""onnxruntime's int8 path: the float model through ``quantize_static`` (the anchor a user
would pick for int8 speed on a CPU, #21).

The float model is exported by torch's TorchScript exporter (opset 17, dynamic batch),
quantized by ``onnxruntime.quantization.quantize_static`` in the QOperator format
(QLinearConv / QLinearAdd / QGemm ...), uint8 activations and per-channel int8 weights
(the u8s8 pair onnxruntime's x64 kernels are fastest with), calibrated on the same
calibration frames the chain used, and run at ``ORT_ENABLE_ALL`` with 2 intra-op threads.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch


class _Frames:
    """onnxruntime's CalibrationDataReader over an array of frames, in batches."""

    def __init__(self, name: str, x: np.ndarray, batch: int = 8):
        self.items = iter([{name: x[i : i + batch]} for i in range(0, len(x), batch)])

    def get_next(self):
        return next(self.items, None)


def export_float(model: torch.nn.Module, example: np.ndarray, path: Path) -> Path:
    """The float model as ONNX (input ``x``, dynamic batch)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(example[:1]),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"], opset_version=17,
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})  # fmt: skip
    return path


def session(model: torch.nn.Module, calibration: np.ndarray, workdir: Path, threads: int = 2):
    """``fn(x) -> outputs`` of the int8 QOperator model, and its op counts (what ran int8)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    Path(workdir).mkdir(parents=True, exist_ok=True)
    fp32 = export_float(model, calibration, Path(workdir) / "float.onnx")
    int8 = Path(workdir) / "int8_qoperator.onnx"
    reader = type("Reader", (_Frames, CalibrationDataReader), {})("x", calibration)
    logging.disable(logging.WARNING)  # its root-logger advice and per-tensor type warnings
    try:
        quantize_static(str(fp32), str(int8), reader, quant_format=QuantFormat.QOperator,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)  # fmt: skip
    finally:
        logging.disable(logging.NOTSET)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # no warning per unused initializer (ReLU6 bounds)
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(int8), opts, providers=["CPUExecutionProvider"])
    ops: dict[str, int] = {}
    for n in onnx.load(str(int8)).graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return (lambda x: sess.run(None, {"x": x})[0]), ops
