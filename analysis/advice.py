"""Advice that works: the advisor's range flags, ranked by what an int16 override of them
measurably restores (issue #19 item 6).

For a run whose chain holds the float model (prepare's) and calibrate's: the float
model's values on the probe frames give the range flags (analysis.range_flags); the
flagged layers (worst first) and the layers the per-layer error ranking puts on top (the
float -> calibrate pair's sensitive ops, else its lowest own cosines) are tried in int16
one at a time, then each flagged group together (the residual adds, every flagged layer)
by analysis.int16_trials, when ``compare.enabled``. Layers that only help together (each
int8 one ruins what the others keep, as along a residual stream) are found by leaving each
out of the whole flagged group; the layers it needs are tried together (``needed``). The advisor lists at most
``ADVISOR_TOP`` flags, best measured gain first, and recommends the trial that restores
the most (or nearly, with fewer overrides), as a ``quant.overrides`` block ready to paste.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.int16_trials import (
    MAX_TRIALS,
    Trial,
    TrialModel,
    leave_one_out,
    run_trials,
    trial_model,
)
from analysis.layer_graph import Layer
from analysis.localize import FLOAT_STAGE, PairVerdict
from analysis.range_flags import RangeFlag, range_flags

ADVISOR_TOP = 10
"""Most flagged layers the advisor lists."""
FROM_ERRORS = 4
"""Layers of the per-layer error ranking tried besides the flagged ones."""
ENOUGH = 0.75
"""Share of the largest measured gain a smaller set of overrides must restore to be the
one recommended (few layers in int16 over many)."""
SINGLES = 16
"""Most layers tried in int16 one at a time."""
NEEDED = 0.02
"""Share of the whole flagged group's gain a layer must cost when left out of it to be
among the layers the group needs."""
ALL = "all flagged"
CALIBRATE = "calibrate"


@dataclass
class Advice:
    """Range flags and int16 trials of one run."""

    flags: list[RangeFlag]
    trials: list[Trial] = field(default_factory=list)
    probes: int = 0
    losses: dict[str, float] = field(default_factory=dict)
    """Flagged layer -> what the whole flagged group loses when it alone stays int8."""
    dtypes: dict[str, str] = field(default_factory=dict)
    """Layer id -> calibrate's output quantizer dtype (the vendor files' quant_dtype of a
    run that stopped before convert, whose integer layer table holds them otherwise)."""

    @property
    def best(self) -> Trial | None:
        """The recommended trial: the fewest overrides that restore at least
        ``ENOUGH`` of the largest gain (None: no trial restores anything)."""
        top = max((t.gain for t in self.trials), default=0.0)
        if top <= 0:
            return None
        return min((t for t in self.trials if t.gain >= ENOUGH * top), key=lambda t: len(t.keys))

    def trial_of(self, lid: str) -> Trial | None:
        return next((t for t in self.trials if t.keys == (lid,)), None)


def advise(ctx, chain: list[str], models: dict, layers: dict[str, Layer],
           verdicts: list[PairVerdict], primary: str) -> Advice | None:  # fmt: skip
    """The advice of a run (None without float and calibrate models or probe frames)."""
    n = min(ctx.spec.compare.probe_samples, len(ctx.evaluation))
    if FLOAT_STAGE not in chain or CALIBRATE not in chain or n == 0:
        return None
    probes = np.arange(n)
    tm = trial_model(ctx, probes, primary)
    _, values = models[FLOAT_STAGE].run(probes)
    flags = sorted(range_flags(values, layers, tm.scales, tm.dtypes), key=_severity)
    advice = Advice(flags, probes=n, dtypes=tm.dtypes)
    if ctx.spec.compare.enabled:
        advice.trials, advice.losses = _try(tm, flags, _error_ranked(verdicts, flags))
    return advice


def _try(tm: TrialModel, flags: list[RangeFlag], ranked: list[str]):
    """(trials best first, leave-one-out losses): singles (flagged, then ``ranked``), the
    groups, each flagged layer left out of the whole group, and the layers the group
    needs (dropping one loses more than ``NEEDED`` of the group's gain) together."""
    keys = [f.layer_id for f in flags]
    groups = {
        "residual adds": [f.layer_id for f in flags if f.kind == "residual add"],
        "mask adds": [f.layer_id for f in flags if f.kind == "mask add"],
        ALL: keys,
    }
    trials = run_trials(tm, (keys + ranked)[:SINGLES], groups)
    full = next((t for t in trials if t.target == ALL), None)
    if full is None or full.gain <= 0 or len(keys) < 2:
        return trials, {}
    loo = leave_one_out(tm, keys, MAX_TRIALS - len(trials) - 1)
    losses = {k: full.gain - t.gain for k, t in loo.items()}
    needed = [k for k in keys if losses.get(k, float("inf")) > NEEDED * full.gain]
    if 0 < len(needed) < len(keys):
        trials += run_trials(tm, [], {"needed": needed}, 1)
    return sorted(trials, key=lambda t: -t.gain), losses


def _severity(flag: RangeFlag) -> float:
    """Int8 steps the typical values get (fewest first)."""
    return min(flag.p99, flag.median) / flag.scale


def _error_ranked(verdicts: list[PairVerdict], flags: list[RangeFlag]) -> list[str]:
    """The float -> calibrate pair's top layers by error: its sensitive ops when it
    diverges, else its lowest own cosines; flagged layers left out."""
    v = next((v for v in verdicts if (v.base, v.analysis) == (FLOAT_STAGE, CALIBRATE)), None)
    if v is None or v.own is None:
        return []
    flagged = {f.layer_id for f in flags}
    ranked = [lid for lid, *_ in v.sensitive] or sorted(v.own.cosine, key=v.own.cosine.get)
    return [lid for lid in ranked if lid not in flagged][:FROM_ERRORS]


def render_trials(advice: Advice) -> str:
    """The int16 trials section of the sensitivity file."""
    metric = advice.trials[0].metric if advice.trials else "-"
    lines = [
        f"# int16 trials: calibrate's fake-quant model on the first {advice.probes} probe "
        "frame(s) only (not every frame), one quant.overrides entry (or group) in int16 at a "
        f"time; {metric} of the output against the float model, most restoring first",
        "target | overrides | metric | before | after | gain",
    ]
    for t in advice.trials:
        lines.append(f"{t.target} | {', '.join(t.keys)} | {t.metric} | {t.before:.6g} | "
                     f"{t.after:.6g} | {t.gain:+.6g}")  # fmt: skip
    if not advice.trials:
        lines.append("no trial ran (compare disabled, or no flagged or ranked layer to try)")
    return "\n".join(lines) + "\n"


def advisor_lines(advice: Advice) -> list[str]:
    """The advisor's flag lines (``mod_name | op_type | abnormal_info | advice``), best
    measured gain first, at most ADVISOR_TOP, and the recommended override block."""
    ranked = sorted(advice.flags, key=lambda f: _benefit(f.layer_id, advice))
    lines = [f"{f.layer_id} | {f.op_type} | {f.info()} | {_advice(f.layer_id, advice)}"
             for f in ranked[:ADVISOR_TOP]]  # fmt: skip
    if len(ranked) > ADVISOR_TOP:
        lines.append(f"{len(ranked) - ADVISOR_TOP} more flagged layer(s) left out "
                     f"(top {ADVISOR_TOP} shown)")  # fmt: skip
    return lines + _recommendation(advice)


def _benefit(lid: str, advice: Advice) -> tuple[float, float]:
    """Sort key, most measured benefit first: the group's loss without it, then its gain
    alone (untried: last)."""
    alone = advice.trial_of(lid)
    return (-advice.losses.get(lid, float("-inf")), -alone.gain if alone else float("inf"))


def _advice(lid: str, advice: Advice) -> str:
    entry = f"quant.overrides: {{{lid}: int16}}"
    alone = advice.trial_of(lid)
    if alone is None:
        return f"int16 not tried (at most {SINGLES} alone); {entry}"
    text = (f"int16 on {advice.probes} probe frame(s): {alone.metric} {alone.before:.4g} -> "
            f"{alone.after:.4g} ({alone.gain:+.3g}) alone")  # fmt: skip
    if lid in advice.losses:
        text += f", {ALL} lose {advice.losses[lid]:.3g} without it"
    return f"{text}; {entry}"


def _recommendation(advice: Advice) -> list[str]:
    best = advice.best
    if best is None:
        return []
    most = advice.trials[0]
    return [
        f"# recommended: {best.target} in int16, {len(best.keys)} override(s) ({best.metric} "
        f"{best.before:.4g} -> {best.after:.4g} on {advice.probes} probe frame(s); "
        f"the most restoring: {most.target}, {len(most.keys)} override(s), -> {most.after:.4g}); "
        "paste into the spec:",
        "# quant:",
        "#   overrides:",
        *[f"#     {k}: int16" for k in best.keys],
    ]
