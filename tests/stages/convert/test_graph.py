"""convert's walk: quantizer parameters as the Converter reads them."""

import numpy as np
import onnx
from onnx import numpy_helper

from stages.convert.graph import Converter, ConvertSettings


def test_custom_domain_quantizer_dtype_is_read_as_text():
    """bpu_round exports QuantizeLinear in the qparity domain with a string dtype attr."""
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    node = onnx.helper.make_node(
        "QuantizeLinear", ["x", "s"], ["q"], domain="qparity", dtype="int16"
    )
    graph = onnx.helper.make_graph([node], "g", [], [], [scale])
    conv = Converter(onnx.helper.make_model(graph), ConvertSettings())
    got_scale, dtype, axis = conv.q_params(node)
    assert (float(got_scale), dtype, axis) == (0.5, "int16", None)
