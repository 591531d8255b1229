"""docs/ops.md is the generated listing of the op table, and it is current."""

from __future__ import annotations

from stages import ops
from stages.ops.listing import DOC, markdown, rows


def test_docs_ops_md_is_generated_from_the_table():
    assert DOC.read_text() == markdown(), "stale: run python -m stages.ops.listing"


def test_one_row_per_entry_naming_targets_instruction_and_kernels():
    got = {r["op"]: r for r in rows()}
    assert list(got) == [e.name for e in ops.ENTRIES]
    hs = got["hardsigmoid"]
    assert "hardsigmoid.default" in hs["aten targets"]
    assert "hardsigmoid_.default" in hs["aten targets"]  # the in-place form
    assert (hs["instruction"], hs["reference"], hs["torch kernel"], hs["native"]) == (
        "lut",
        "custom_ops._lut_evaluate",
        "exec_table_ops.k_lut",
        "qp_gather",
    )
    assert got["quantize"]["category"] == "quantizer"  # inserted by the chain, no aten op
