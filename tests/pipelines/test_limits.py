"""Per-stage limits: a stage past its time or memory bound fails cleanly and says which."""

from __future__ import annotations

import time

import numpy as np
import pytest
import yaml

from pipelines import limits
from pipelines.flow import run_chain
from pipelines.limits import LimitExceeded, guard
from schemas.spec import parse_spec
from schemas.store import RunStore
from tests.conftest import tiny_spec_dict


def test_time_limit_stops_a_python_loop():
    match = r"stage slow: stopped: it ran .* \(limit 0.3 s\)"
    with pytest.raises(LimitExceeded, match=match), guard("slow", 0.3, None):
        end = time.monotonic() + 10
        while time.monotonic() < end:
            pass


def test_memory_limit_stops_a_growing_stage():
    keep = []
    match = r"grew .* MB of memory \(limit 50 MB\)"
    with pytest.raises(LimitExceeded, match=match), guard("hungry", None, 50):
        for _ in range(400):
            keep.append(np.ones(2**20))  # 8 MB each, touched
            time.sleep(0.01)


def test_no_limits_no_watchdog(monkeypatch):
    """No limit starts no watchdog thread; the same spy sees one as soon as a limit is set."""
    started = []
    monkeypatch.setattr(limits, "_watch", lambda *args: started.append(args[3:]))
    with guard("free", None, None):
        pass
    assert started == []
    with guard("bounded", 60, None):
        pass
    assert started == [(60, None)]


def test_a_run_past_its_limit_marks_the_stage_failed(tmp_path):
    data = tiny_spec_dict(limits={"stage_seconds": 0.05})
    with pytest.raises(LimitExceeded, match="stage prepare"):
        run_chain(parse_spec(data, "t"), yaml.safe_dump(data), tmp_path, use_prefect=False)
    (m,) = RunStore(tmp_path).list_runs()
    assert m.status == "failed" and m.stages["prepare"].status == "failed"
    assert "limit 0.05 s" in m.stages["prepare"].error


def test_the_interruption_waits_until_the_stage_is_out_of_torch(monkeypatch):
    """Past its limit while inside torch (here: while a flag says so), the stage is not
    interrupted; it is as soon as it is back in its own code."""
    inside = {"torch": True}
    monkeypatch.setattr(limits, "in_torch", lambda filename: inside["torch"])
    released = []
    with pytest.raises(LimitExceeded, match="limit 0.1 s"), guard("export", 0.1, None):
        end = time.monotonic() + 0.6
        while time.monotonic() < end:  # "in torch" well past the limit: not interrupted
            pass
        inside["torch"], released = False, [time.monotonic()]
        while time.monotonic() < end + 10:
            pass
    assert released, "interrupted while still in torch"


def test_torch_files_are_told_apart():
    import torch

    assert limits.in_torch(torch.nn.functional.__file__)
    assert not limits.in_torch(limits.__file__)
