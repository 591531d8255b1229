"""bench/sim_probe.py's timing: medians per instruction over every timed round."""

from __future__ import annotations

from bench.sim_probe import measure


class _Sim:
    """An executor stand-in whose first runs time every instruction (kernels, replays) and
    later ones only instruction 0 (a frozen plan: views take no time)."""

    def __init__(self):
        self.runs, self.timings = 0, []

    def run(self):
        self.runs += 1
        self.timings = [(0, "conv", 1.0)] + ([(1, "layout", 5.0)] if self.runs <= 2 else [])

    def timings_by_op(self):
        out = {}
        for _, op, s in self.timings:
            out[op] = out.get(op, 0.0) + s
        return out


def test_instructions_absent_from_most_rounds_get_their_median_as_zero():
    sim = _Sim()
    _, split, _ = measure({"sim": sim.run}, 5, sim)
    assert split["rounds"] >= 5
    assert split["instrs"] == {0: 1.0, 1: 0.0}  # not 5.0: the layout ran in one round only
    assert split["ops"] == {"conv": 1.0, "layout": 0.0}
