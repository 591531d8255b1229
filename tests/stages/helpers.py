"""Run a prefix of the chain with plain function calls (no Prefect, no cache); break the
frozen plan or the kernels on purpose."""

from simulator.runtime.executor import Executor
from simulator.runtime.frozen import Frozen
from stages.registry import BY_NAME
from stages.registry_types import StageCall

H = "0" * 64


def run_stages(ctx, *names):
    """Call the named stages in order, saving each artifact; returns {name: artifact}."""
    arts, art = {}, None
    for name in names:
        art = BY_NAME[name].fn(art, ctx, StageCall(name, H, H, "test"))
        ctx.run.save_artifact(art)
        arts[name] = art
    return arts


def break_frozen_plan(monkeypatch, rows: int | None = None) -> None:
    """Every frozen-plan run's first output one off in its first value (a wrong kernel on
    the path that gives the metrics); ``rows``: only runs on batches of that many samples."""
    run = Frozen.run

    def off_by_one(self, xs, timings=None):
        outs = run(self, xs, timings)
        if outs is not None and rows in (None, len(xs[0])):
            name = next(iter(outs))
            outs[name] = outs[name].clone()
            outs[name].view(-1)[0] += 1
        return outs

    monkeypatch.setattr(Frozen, "run", off_by_one)


def break_kernels(monkeypatch) -> None:
    """Every instruction-by-instruction run's (kernels or replays) first output one off in
    its first value: a wrong kernel on the path every machine runs, with or without the
    compiled kernels (the frozen plan exists only with them: :func:`break_frozen_plan`)."""
    execute = Executor._execute

    def off_by_one(self, bufs):
        execute(self, bufs)
        name = next(iter(self.program.outputs))
        bufs[name] = bufs[name].clone()
        bufs[name].view(-1)[0] += 1

    monkeypatch.setattr(Executor, "_execute", off_by_one)
