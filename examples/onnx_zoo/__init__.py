"""ONNX files in the idioms of paddle2onnx, ultralytics and tf2onnx (examples/onnx_zoo)."""
