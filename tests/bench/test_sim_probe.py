"""bench/sim_probe.py's timing: medians per instruction over every timed round, each engine
timed from an idle process."""

from __future__ import annotations

from bench.sim_probe import measure, settle


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


class _Clock:
    """Fake clocks for settle: ``sleep`` advances the wall clock, and the process's CPU
    time by a whole poll while ``spinning`` sleeps are left (another engine's threads)."""

    def __init__(self, spinning: int):
        self.now, self.used, self.spinning, self.sleeps = 0.0, 0.0, spinning, 0

    def sleep(self, s: float) -> None:
        self.now, self.sleeps = self.now + s, self.sleeps + 1
        if self.spinning:
            self.used, self.spinning = self.used + s, self.spinning - 1

    def kw(self) -> dict:
        return {"cpu": lambda: self.used, "sleep": self.sleep, "clock": lambda: self.now}


def test_settle_waits_while_threads_spin_and_stops_at_the_first_idle_poll():
    c = _Clock(spinning=3)
    assert settle(limit=1.0, poll=0.0625, **c.kw()) == 0.25
    assert c.sleeps == 4


def test_settle_gives_up_at_its_limit():
    c = _Clock(spinning=10**6)
    assert settle(limit=0.5, poll=0.0625, **c.kw()) == 0.5  # powers of two: exact sums
    assert c.sleeps == 8


def test_every_timed_call_follows_a_settle():
    sim, events = _Sim(), []
    fns = {"sim": lambda: (events.append("sim"), sim.run()),
           "other": lambda: events.append("other")}  # fmt: skip
    _, split, _ = measure(fns, 5, sim, wait=lambda: events.append("wait"))
    timed = events[2:]  # after the warm-up of each engine
    assert timed == ["wait", "sim", "wait", "other"] * split["rounds"]
