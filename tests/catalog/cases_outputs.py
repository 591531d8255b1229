"""Models whose outputs the chain cannot carry or score, for the catalog
(tests/catalog/test_bad_inputs.py): each error names the output (its canonical id) or the
spec field that picks it."""

from __future__ import annotations

from torch import nn

from schemas.errors import SpecError, StageError
from schemas.spec import parse_spec
from stages.context import RunContext
from tests.conftest import tiny_spec_dict
from tests.models import TwoHeadNet

HERE = "tests.catalog.cases_outputs"


class NoneHead(TwoHeadNet):
    """A detector that returns None where an optional head is switched off."""

    def forward(self, x):
        return super().forward(x)[0], None


def none_head() -> nn.Module:
    return NoneHead().eval()


def _checked(factory: str, dataset: str = "tests.models:two_head_data", **compare):
    """The splits as a run reads them: loaded, then checked against the float model."""
    data = {**tiny_spec_dict()["data"], "dataset": dataset}
    spec = tiny_spec_dict(model={"factory": factory}, data=data, compare=compare)
    return RunContext(spec=parse_spec(spec, "t"), run=None, code_version="").splits


def cases() -> dict:
    return {
        "output: a string leaf": (lambda e: _checked("tests.models:bad_leaf"), StageError,
                                  "output.name is str"),
        "output: a None leaf": (lambda e: _checked(f"{HERE}:none_head"), StageError,
                                "output.1 is NoneType"),
        "output: labels fit two heads": (lambda e: _checked("tests.models:two_heads"),
                                         SpecError, "output.0, output.1"),
        "output: compare.output not an output": (
            lambda e: _checked("tests.models:two_heads", output="output.2"), SpecError,
            "compare.output: 'output.2'"),
        "output: compare.output malformed": (lambda e: parse_spec(tiny_spec_dict(
            compare={"output": "boxes"}), "s.yaml"), SpecError, "compare.output"),
        "output: labels on the box head": (
            lambda e: _checked("tests.models:two_heads", output="output.0"), StageError,
            "data.train.labels"),
    }  # fmt: skip
