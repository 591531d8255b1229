"""What the CLI prints about a run: injected faults say whether they changed anything."""

from __future__ import annotations

import io

from rich.console import Console

from qparity.views import show_run
from schemas import table_rows
from schemas.spec_faults import FaultSpec
from schemas.store import Run
from schemas.tables import write_rows
from stages.fault_effects import Effect
from stages.faults import record


def test_show_says_which_injected_fault_changed_nothing(make_ctx):
    ctx = make_ctx()
    applied = [
        (FaultSpec(kind="scale_steps", layer="conv2"), "conv2", "conv",
         Effect(False, "no integer of layer conv2 changes")),
        (FaultSpec(kind="bias_drop", layer="conv"), "conv", "conv",
         Effect(True, "9 of 10 output values of conv change")),
    ]  # fmt: skip
    record(ctx, "convert", applied)
    buf = io.StringIO()
    show_run(Console(file=buf, width=200), ctx.run.root.parent, ctx.run.run_id)
    lines = {ln.split("│")[2].strip(): ln for ln in buf.getvalue().splitlines() if "│ conv" in ln}
    assert "CHANGED NOTHING: no integer of layer conv2 changes" in lines["conv2"]
    assert "changed: 9 of 10" in lines["conv"] and "NOTHING" not in lines["conv"]


def test_show_reads_and_verifies_the_metrics_once(make_ctx, monkeypatch):
    """The stage table's primary metric and the metrics table come from one read (each read
    hashes and parses every part: ~10 ms of `qparity show` on a digits run)."""
    ctx = make_ctx()
    row = {"run_id": ctx.run.run_id, "stage": "qat", "metric": "top1", "value": 0.5,
           "n_samples": 8, "output": "y"}  # fmt: skip
    write_rows(ctx.run, "metrics", [row], "qat")
    read = []
    original = table_rows.check_table

    def counted(root, table, digest_of):
        read.append(table)
        return original(root, table, digest_of)

    monkeypatch.setattr(table_rows, "check_table", counted)
    buf = io.StringIO()
    show_run(Console(file=buf, width=200), ctx.run.root.parent, ctx.run.run_id)
    assert read.count("metrics") == 1 and "│ 0.5 " in buf.getvalue()


def test_show_opens_the_run_and_reads_its_manifest_once(make_ctx, monkeypatch):
    """The header and the stage table share one manifest read (the stage table used to open
    the run and validate its manifest again)."""
    ctx = make_ctx()
    reads = []
    original = Run.manifest

    def counted(self, *args, **kwargs):
        reads.append(self.run_id)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Run, "manifest", counted)
    buf = io.StringIO()
    show_run(Console(file=buf, width=200), ctx.run.root.parent, ctx.run.run_id)
    assert reads == [ctx.run.run_id] and f"run {ctx.run.run_id}" in buf.getvalue()
