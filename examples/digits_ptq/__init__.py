"""The PTQ chain on the bundled digits CNN, exported to ONNX at run time."""
