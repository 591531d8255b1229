"""bench/sim_probe.py's timing: medians per instruction over every timed round, each engine
timed from an idle process."""

from __future__ import annotations

import threading

from bench.sim_probe import WARMUP, measure, runnable_threads, settle


class _Sim:
    """An executor stand-in whose runs up to the first timed one time every instruction
    (kernels, replays) and later ones only instruction 0 (a frozen plan: views take no
    time)."""

    def __init__(self):
        self.runs, self.timings = 0, []

    def run(self):
        self.runs += 1
        self.timings = [(0, "conv", 1.0)] + ([(1, "layout", 5.0)] if self.runs <= WARMUP + 1 else [])

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
    """Fake clocks for settle: ``sleep`` advances the wall clock; another engine's thread
    stays runnable for the first ``spinning`` sleeps."""

    def __init__(self, spinning: int):
        self.now, self.spinning, self.sleeps = 0.0, spinning, 0

    def sleep(self, s: float) -> None:
        self.now, self.sleeps = self.now + s, self.sleeps + 1
        self.spinning = max(self.spinning - 1, 0)

    def kw(self) -> dict:
        return {"runnable": lambda: int(self.spinning > 0), "sleep": self.sleep,
                "clock": lambda: self.now}  # fmt: skip


def test_settle_waits_while_threads_spin_and_stops_once_none_runs():
    c = _Clock(spinning=3)
    assert settle(limit=1.0, poll=0.0625, **c.kw()) == 0.1875
    assert c.sleeps == 3


def test_settle_gives_up_at_its_limit():
    c = _Clock(spinning=10**6)
    assert settle(limit=0.5, poll=0.0625, **c.kw()) == 0.5  # powers of two: exact sums
    assert c.sleeps == 8


def test_a_spinning_thread_is_runnable_and_a_waiting_one_is_not():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        assert runnable_threads() >= 1
    finally:
        stop.set()
        spinner.join()
    waiter = threading.Thread(target=threading.Event().wait, args=(1.0,))
    waiter.start()
    assert settle(limit=0.5) < 0.5 and runnable_threads() == 0
    waiter.join()


def test_every_timed_call_follows_a_settle():
    sim, events = _Sim(), []
    fns = {"sim": lambda: (events.append("sim"), sim.run()),
           "other": lambda: events.append("other")}  # fmt: skip
    _, split, _ = measure(fns, 5, sim, wait=lambda: events.append("wait"))
    assert events[: 2 * WARMUP] == ["sim", "other"] * WARMUP  # the warm-up rounds, untimed
    timed = events[2 * WARMUP :]
    assert timed == ["wait", "sim", "wait", "other"] * split["rounds"]
