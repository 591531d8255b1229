"""Measurement helpers of bench/simulator.py: machine load (CpuWatch, wait_quiet) and the
anatomy of the simulator's convolutions (where a blocked conv spends its time)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np


class CpuWatch:
    """CPU used by *other* processes (in cores) between start and stop: /proc/stat busy
    time minus this process's own (and its children's) CPU time."""

    @staticmethod
    def _busy() -> float:
        try:
            with open("/proc/stat") as fh:
                v = [int(t) for t in fh.readline().split()[1:]]
        except OSError:
            return float("nan")
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> CpuWatch:
        self.t, self.busy, self.own = time.perf_counter(), self._busy(), self._own()
        return self

    def stop(self) -> float:
        wall = time.perf_counter() - self.t
        other = (self._busy() - self.busy) - (self._own() - self.own)
        return max(other, 0.0) / max(wall, 1e-9)


def wait_quiet(max_wait: float, limit: float = 0.25) -> float:
    """Wait (up to ``max_wait`` s) until other processes use < ``limit`` cores; return it."""
    deadline, load = time.perf_counter() + max_wait, float("nan")
    while True:
        w = CpuWatch().start()
        time.sleep(1.0)
        load = w.stop()
        if load < limit or time.perf_counter() >= deadline:
            return load


SETTLE_S = 0.25
"""Longest wait for this process's threads to go idle before an engine is timed."""


def runnable_threads() -> int:
    """Threads of this process, the caller aside, that are running or waiting for a core
    (state ``R`` in ``/proc/self/task/<tid>/stat``); 0 where /proc is missing."""
    me, n = threading.get_native_id(), 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:  # the thread ended meanwhile
            continue
        n += int(tid) != me and stat[stat.rindex(")") + 2] == "R"
    return n


def settle(limit: float = SETTLE_S, poll: float = 0.001, runnable=runnable_threads,
           sleep=time.sleep, clock=time.perf_counter) -> float:  # fmt: skip
    """Wait until no other thread of this process is running (:func:`runnable_threads`),
    at most ``limit`` s; return the seconds waited.

    Each engine leaves threads spinning after its run: onnxruntime's int8 session (its
    pool's default ``allow_spinning``) for about 40 ms, libgomp's workers (torch) about
    10 ms, the simulator's pool 5 ms. Timed right after, the next engine shares the 2
    cores with them. Thread states, not CPU time: the CPU time of a thread running on
    another core is only added up at the scheduler's tick (4 ms here), so the earlier test
    (under 10% of a core over a 2 ms poll) passed while onnxruntime's worker spun on, and
    the transformer at batch 256, timed right after ORT int8, took 31.7 ms a run against
    8.9 ms after a real settle (bench/README.md, "Timing after a real settle")."""
    t0 = clock()
    while clock() - t0 < limit and runnable():
        sleep(poll)
    return clock() - t0


WARMUP = 5
"""Untimed runs of each engine before the timed rounds. The simulator's first runs record
its replays, freeze its plan and (batch split) prove the split and build the chunks' one
call: MobileNetV2 at batch 8, timed after one warm-up, took 33, 17 and 10 ms in its first
three rounds against 7.5-8.0 ms from the fourth on, which moved the median of its 9 rounds
(1.56-1.65x ORT int8 in three runs where the rounds after the fourth gave 1.74-1.81x).
onnxruntime and torch are settled after one; they get as many (bench/README.md)."""

MIN_TIMED_S = 3.0
"""Small models get more rounds, up to this many seconds of them: their per-batch times are
a few ms, and on this shared 2-core machine a 7-round median of those still moves ~20%."""


def measure(fns: dict, rounds: int, sim_exec,
            wait=settle) -> tuple[dict[str, float], dict, float]:  # fmt: skip
    """Warm up each engine (:data:`WARMUP` rounds), then interleaved rounds (``rounds``, or
    more for fast models: :data:`MIN_TIMED_S`), each engine timed after ``wait()``
    (:func:`settle`): median seconds per engine, the simulator's median seconds per op
    kind and per instruction, and the CPU (cores) other processes used meanwhile."""
    for _ in range(WARMUP):
        t0 = time.perf_counter()
        for fn in fns.values():
            fn()
        per_round = time.perf_counter() - t0
    rounds = max(rounds, min(int(MIN_TIMED_S / max(per_round, 1e-6)), 500))
    times: dict[str, list[float]] = {k: [] for k in fns}
    by_op: list[dict[str, float]] = []
    per_instr: dict[int, list[float]] = {}
    watch = CpuWatch().start()
    for _ in range(rounds):
        for k, fn in fns.items():
            wait()
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
            if k == "sim":
                by_op.append(sim_exec.timings_by_op())
                for i, _, s in sim_exec.timings:
                    per_instr.setdefault(i, []).append(s)
    load = watch.stop()
    ops = {k: float(np.median([r.get(k, 0.0) for r in by_op])) for k in by_op[0]}
    # an instruction with no time in a round (a view under the frozen plan) counts 0 there
    instrs = {i: float(np.median(v + [0.0] * (rounds - len(v)))) for i, v in per_instr.items()}
    split = {"ops": ops, "instrs": instrs, "rounds": rounds}
    return {k: float(np.median(v)) for k, v in times.items()}, split, load


def conv_anatomy(sim_exec, x, repeats: int = 3) -> dict[str, float] | None:
    """Seconds of all blocked NHWC CONV instructions (simulator.kernels.exec_conv) split into
    pad + im2col, the int8 GEMM and the fused float64 epilogue, plus the rest of the
    instruction (block bookkeeping, output writes), re-running exec_conv's own steps; convs
    on the compiled kernel split into its input copy and the kernel. None when the executor
    internals differ from what this expects."""
    from simulator.program.isa import Op
    from simulator.runtime import native, threads

    ex, in_name = sim_exec
    parts: dict[str, float] = {}
    try:  # on the threads a run would take now (simulator.runtime.threads)
        with threads.kernel_threads(native.untraced(), threads.kernel_count()):
            bufs = ex._load({in_name: x})
            ex._run(bufs)
            for ins in ex.program.instructions:
                if ins.op == Op.CONV and ins.attrs.get("layout") == "nhwc":
                    for k, v in _conv_steps(ex, ins, bufs, repeats).items():
                        parts[k] = parts.get(k, 0.0) + v
    except Exception as e:  # internals moved: skip the breakdown, keep the bench
        print(f"# conv anatomy skipped ({type(e).__name__}: {e})")
        return None
    whole = parts.pop("whole", 0.0)
    parts["rest (blocks, output writes, int64 fallbacks)"] = max(whole - sum(parts.values()), 0.0)
    return parts


STEPS = ("pad + im2col", "int8 GEMM (torch._int_mm)",
         "float64 epilogue (bias, requantize, add, relu, cast)", "whole")  # fmt: skip
NATIVE_STEPS = ("compiled kernel: pad + uint8 offset copy",
                "compiled kernel: VNNI conv + fused epilogue")  # fmt: skip


def _conv_steps(ex, ins, bufs, repeats: int) -> dict[str, float]:
    from simulator.kernels import exec_conv, exec_native
    from simulator.kernels import exec_kernels as ek
    from simulator.runtime.executor import KERNELS

    x = bufs[ins.inputs[0]]
    b = bufs[ins.inputs[1]] if len(ins.inputs) > 1 else None
    whole = _median_time(lambda: KERNELS[ins.op](ins, bufs, ex.consts), repeats)
    key = ("conv_plan", ins.outputs[0], x.dtype, None if b is None else b.dtype)
    plan = ex.consts.derived.get(key)
    if plan is None or plan.w_f32 is not None:  # int64 path / one float32 conv: no split
        return {"whole": whole}
    strides, pads, dil = plan.geometry
    if plan.native is not None:  # the compiled kernel: its input copy, then one pass
        pad = _median_time(lambda: exec_native._padded(plan.native, x.contiguous(), pads),
                           repeats)  # fmt: skip
        return {NATIVE_STEPS[0]: pad, NATIVE_STEPS[1]: max(whole - pad, 0.0), "whole": whole}
    o = plan.out_channels

    def im2col():
        xp = ek.pad_axes(x[..., : plan.channels], (1, 2), pads, 0)
        cols = exec_conv.im2col_view(xp, plan.kernel, strides, dil)
        n, oh, ow = cols.shape[:3]
        bl = exec_conv.blocks(n, oh, ow, max(exec_conv.BLOCK_ELEMS // max(o, 1), 1))
        return bl, [exec_conv.im2col_rows(cols[n0:n1, h0:h1], x.dtype) for n0, n1, h0, h1 in bl]

    bl, cs = im2col()
    accs = [ek.gemm_int(c, plan.wmat) for c in cs]
    bs = [None if b is None else b[n0:n1, h0:h1, :, :o].reshape(-1, o) for n0, n1, h0, h1 in bl]
    return dict(zip(STEPS, (
        _median_time(im2col, repeats),
        _median_time(lambda: [ek.gemm_int(c, plan.wmat) for c in cs], repeats),
        _median_time(lambda: [plan.epi.apply(a, bb) for a, bb in zip(accs, bs, strict=True)],
                     repeats),
        whole), strict=True))  # fmt: skip


def _median_time(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


# -- main -----------------------------------------------------------------------------------


AMX_KERNELS = {"qp_linear_amx", "qp_conv_amx"}
"""The compiled calls that run on AMX-INT8 tiles (csrc/qamx.c, csrc/qamxconv.c)."""


def kernel_variants(sim_exec, x) -> str:
    """Which kernel each instruction ran on, counted by op, from one instruction-by-instruction
    run with every compiled call traced: AMX-INT8 tiles (:data:`AMX_KERNELS`), the loaded
    build's kernels (any other ``qp_*`` call: "AVX-512 VNNI" or "AVX2", native.build_name()),
    or torch (no compiled call: the fallback, and the layout views)."""
    from simulator.runtime import native
    from simulator.runtime.executor import KERNELS

    ex, in_name = sim_exec
    bufs = ex._load({in_name: x})
    build = native.build_name() or "compiled"
    ran: dict[str, dict[str, int]] = {"AMX": {}, build: {}, "torch": {}}
    for ins in ex.program.instructions:
        with native.tracing() as trace:
            ys = KERNELS[ins.op](ins, bufs, ex.consts)
        bufs.update(zip(ins.outputs, ys, strict=True))
        names = {getattr(fn, "__name__", "") for fn, _, _ in trace.calls}
        kind = "AMX" if names & AMX_KERNELS else build if names else "torch"
        ran[kind][ins.op.value] = ran[kind].get(ins.op.value, 0) + 1
    return "; ".join(
        f"{kind}: " + (", ".join(f"{op} x{n}" for op, n in sorted(ops.items())) or "none")
        for kind, ops in ran.items()
    )


BUSY_LOOP = "import os\nos.sched_setaffinity(0, {%d})\nwhile True:\n    pass\n"


def under_load(fns: dict, sim, rounds: int, core: int = 1) -> tuple[dict[str, float], float]:
    """Median seconds per engine while a busy loop holds core ``core`` (a child process,
    ended after), the simulator once per thread policy (``QPARITY_THREADS`` 2 and 1, fixed,
    and auto, :func:`simulator.runtime.threads.kernel_count`); and the cores other
    processes (the loop included) used meanwhile."""
    import subprocess
    import sys

    policies = {f"sim {p}": p for p in ("2", "1", "auto")}
    timed = {**{k: _with_threads(sim, p) for k, p in policies.items()},
             **{k: v for k, v in fns.items() if k != "sim"}}  # fmt: skip
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP % core])
    try:
        time.sleep(0.5)  # the loop is running, the free-core sampler sees it
        watch = CpuWatch().start()
        times = _rounds(timed, rounds)
        load = watch.stop()
    finally:
        loop.kill()
        loop.wait()
        os.environ.pop("QPARITY_THREADS", None)
    return times, load


def _with_threads(fn, policy: str):
    def run():
        os.environ["QPARITY_THREADS"] = policy
        return fn()

    return run


def _rounds(fns: dict, rounds: int) -> dict[str, float]:
    """:data:`WARMUP` warm-up rounds, then ``rounds`` interleaved rounds, each engine timed
    after :func:`settle`: median seconds per engine."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(WARMUP):
        for fn in fns.values():
            fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            settle()
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}
