"""Fixtures shared by the example tests."""

from __future__ import annotations

import pytest

from examples.digits import data


@pytest.fixture(scope="module")
def splits() -> dict:
    """The digits splits, loaded once."""
    return data.load()
