"""The op table: every derived table agrees with the entries, targets are unique, and
every entry reaches instructions the simulator implements."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from simulator.instructions import INSTRUCTIONS
from simulator.program.isa import Op
from stages import ops
from stages.functionalize import functional_variant
from stages.layers import OP_TABLE, classify
from stages.onnx_export import _RULES


def test_every_target_belongs_to_one_entry():
    counts = Counter(t for e in ops.ENTRIES for t in e.targets)
    assert [str(t) for t, n in counts.items() if n > 1] == []
    assert len(ops.BY_NAME) == len(ops.ENTRIES), "op names are unique"


def test_the_op_table_prepare_uses_is_the_entries():
    assert {t: (e.name, e.category) for e in ops.ENTRIES for t in e.targets} == OP_TABLE


def test_export_rules_cover_exactly_the_targets_of_entries_with_a_rule():
    for e in ops.ENTRIES:
        rules = e.onnx_rules()
        assert set(rules) == (set(e.targets) if e.onnx is not None else set()), e.name
        assert all(_RULES[t] is rule for t, rule in rules.items()), e.name
    assert set(_RULES) == {t for e in ops.ENTRIES if e.onnx is not None for t in e.targets}


def test_entries_sharing_a_convert_key_share_its_rule():
    seen: dict = {}
    for e in ops.ENTRIES:
        for key, rule in e.convert_keys():
            assert seen.setdefault(key, rule) is rule, f"{e.name}: {key} has two rules"
    assert ops.convert_rules() == seen


def test_quantizer_placement_views():
    params = {"layer_norm": 1, "batch_norm": 1, "prelu": 1, "embedding": 0, "group_norm": 1}
    assert params | {"conv_transpose": 1} == ops.PARAM_OPS
    assert {"add", "sub"} == ops.ACCUMULATOR_USERS
    assert {n for n, t in ops.TABLE_OPS.items() if t != "Lut"} == {"softmax", "layer_norm"}
    lut = {e.name for e in ops.ENTRIES if e.category is ops.Category.LUT}
    assert {n for n, t in ops.TABLE_OPS.items() if t == "Lut"} == lut


def test_every_entry_reaches_an_instruction_with_kernels():
    for e in ops.ENTRIES:
        assert e.instructions, e.name
        assert all(op in INSTRUCTIONS for op in e.instructions), e.name
    reached = {op for e in ops.ENTRIES for op in e.instructions}
    assert set(Op) - reached == {Op.PREPROCESS}  # the board's camera input, not an aten op


def test_every_convert_rule_of_a_table_op_is_keyed_by_its_table_op():
    for e in ops.ENTRIES:
        if e.table_op:
            assert f"qparity.{e.table_op}" in dict(e.convert), e.name


@pytest.mark.parametrize("op", ["relu", "add", "hardsigmoid", "mul", "elu"])
def test_an_in_place_form_is_classified_as_its_entry(op):
    """functionalize rewrites ``aten.op_`` to a target of the entry before classify."""
    e = ops.BY_NAME[op]
    overload = e.targets[0]
    inplace = getattr(getattr(torch.ops.aten, f"{overload._opname}_"), overload._overloadname)
    g = torch.fx.Graph()
    node = g.call_function(inplace, (g.placeholder("x"),))
    assert functional_variant(node) is overload
    node.target = functional_variant(node)
    assert classify(node) == (op, e.category)
