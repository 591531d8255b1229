"""``qparity ops``: the op table on the command line."""

from __future__ import annotations

from typer.testing import CliRunner

from qparity.cli import app
from schemas.errors import SpecError
from stages import ops
from stages.ops.listing import markdown


def test_ops_lists_one_op_with_its_targets_and_kernels():
    res = CliRunner().invoke(app, ["ops", "hardsigmoid"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "aten targets: hardsigmoid.default, hardsigmoid_.default" in lines
    assert "instruction: lut" in lines and "native: qp_gather" in lines


def test_ops_lists_every_op():
    res = CliRunner().invoke(app, ["ops"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert len(lines) == len(ops.ENTRIES)
    assert lines[0].startswith("conv (weighted, weighted): conv1d.default")
    assert (
        "[reference int_ops.qconv; torch exec_ops.k_conv; native qp_conv, qp_conv_amx, qp_dwconv, qp_pad]"
        in lines[0]
    )


def test_ops_markdown_is_docs_ops_md():
    res = CliRunner().invoke(app, ["ops", "--markdown"])
    assert res.exit_code == 0, res.output
    assert res.output == markdown()


def test_an_unknown_op_names_the_known_ones():
    res = CliRunner().invoke(app, ["ops", "nope"])
    assert isinstance(res.exception, SpecError)
    assert "no op 'nope'" in str(res.exception) and "hardsigmoid" in str(res.exception)


def test_quiet_lists_the_op_names_only():
    res = CliRunner().invoke(app, ["ops", "--quiet"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [e.name for e in ops.ENTRIES]
