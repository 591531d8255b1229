"""convert's requantize helpers: multipliers and the error beyond their width."""

import numpy as np
import onnx
import pytest

from schemas.errors import StageError
from stages.convert.graph import Converter, ConvertSettings
from stages.convert.rules import _mult


def test_public_requantize_example_at_16_bits():
    conv = Converter(onnx.ModelProto(), ConvertSettings(multiplier_bits=16))
    conv.layer = "conv"
    m, s = _mult(conv, "req", 0.1 * 1.0 / 0.2028451)
    assert int(conv.new_inits[m][0]) == 32308 and int(conv.new_inits[s][0]) == 16


def test_narrow_multipliers_name_the_layer_on_every_requantize():
    conv = Converter(onnx.ModelProto(), ConvertSettings(multiplier_bits=8))
    conv.layer = "fc"
    with pytest.raises(StageError, match=r"layer fc: the req ratio of its scales is 300, .* 127"):
        _mult(conv, "req", np.array([0.5, 300.0]))
    assert conv.new_inits == {}
