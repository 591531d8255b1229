"""The PTQ chain from an ONNX float model (the vendor's PTQ flow).

Stages and the files they write (``<name>`` = the model file's stem)::

    original    <name>_original_float_model.onnx   shape inference, legality, layer ids
    optimized   <name>_optimized_float_model.onnx  folding, patterns, BN fusion, redundant ops
    calibrated  <name>_calibrated_model.onnx       QDQ per the quant config (minmax)
    ptq         <name>_ptq_model.onnx              table ops (sigmoid, tanh, exp) fixed point
    quantized   <name>_quantized_model.onnx        stages.convert.graph.Converter, unchanged
    hbm         <name>.hbm                         stages.compile_graph.Compiler, unchanged
    board       (no file)                          the simulated BPU executor on the .hbm

The calibrated and ptq graphs follow the QDQ conventions of :mod:`stages.onnx_export`
(``<layer>[weight]/q``, ``<layer>[output]/q``, the final tensor of a layer named the layer
id, ``metadata_props["qparity.layer_id"]``), so the QAT chain's convert and compile run on
them unchanged. :mod:`stages.ptq.chain` runs one stage; ``pipelines.ptq`` runs the chain.
"""
