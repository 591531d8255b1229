"""Reference arithmetic: the integer semantics written once (rounding, requantize, lookup
tables, softmax / LayerNorm decompositions, the numpy reference kernels, the integer and
custom ONNX ops of quantized.onnx, the board's camera input path)."""
