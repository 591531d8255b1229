"""simulator.runtime.memo: values derived once per (owner, key), living on the owner."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simulator.runtime.memo import as_int, derived


@dataclass(frozen=True, eq=False)
class _Owner:
    name: str


def test_derived_builds_once_per_owner_and_key():
    calls = []
    a, b = torch.tensor([1, 2]), torch.tensor([1, 2])  # equal values, different owners
    for owner, key in [(a, "x"), (a, "x"), (a, "y"), (b, "x"), (b, "x")]:
        derived(owner, key, lambda o=owner, k=key: calls.append((id(o), k)) or len(calls))
    assert calls == [(id(a), "x"), (id(a), "y"), (id(b), "x")]
    assert derived(a, "x", lambda: -1) == 1 and derived(b, "x", lambda: -1) == 3


def test_derived_on_a_frozen_dataclass_and_as_int():
    owner = _Owner("epi")
    assert derived(owner, ("lanes", 4), lambda: "built") == "built"
    assert derived(owner, ("lanes", 4), lambda: "again") == "built"
    assert as_int(torch.tensor([7])) == 7 and as_int(torch.tensor(-3)) == -3
