"""convert: qat.onnx -> quantized.onnx (integers throughout), one package.

- :mod:`stages.convert.stage`: the stage function ``convert`` (write, evaluate, check for
  saturating layers), ``run_integer`` and ``layer_json``;
- :mod:`stages.convert.graph`: the walk (:class:`~stages.convert.graph.Converter`), the
  integer form of a tensor (``QTensor``) and the arithmetic settings;
- :mod:`stages.convert.rules`: the requantize helpers and the quantizer, table,
  passthrough, clip and max-pool rules; :mod:`stages.convert.compute`: the compute ops.

Which rule converts which qat.onnx op type is the op table's view
:func:`stages.ops.convert_rules`; the walk looks it up when it runs, so the rules (which
import the walk's types) and the walk import each other in one direction only.
"""
