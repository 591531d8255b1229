"""pre_export's table ops: a softmax behind an additive attention mask is named, not
built from a step too coarse for its exp."""

from __future__ import annotations

import pytest

from schemas.errors import StageError
from tests.stages.helpers import run_stages


def _tokens_ctx(make_ctx):
    data = {**make_ctx().spec.data.model_dump(), "dataset": "tests.models:tokens_data"}
    return make_ctx(model={"factory": "tests.models:tokens"}, data=data)


def test_a_mask_sized_softmax_input_names_the_add_and_the_override(make_ctx):
    ctx = _tokens_ctx(make_ctx)
    with pytest.raises(StageError, match="pre_export, layer softmax") as e:
        run_stages(ctx, "prepare", "calibrate", "pre_export")
    assert "(from add_1) is quantized int8 with step 78.4" in e.value.message
    assert "{add_1: int16, softmax: int16}" in e.value.hint
