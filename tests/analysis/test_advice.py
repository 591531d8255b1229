"""The advisor's lines: capped, ranked by measured benefit, with a paste-ready override."""

from __future__ import annotations

from analysis import vendor_files as vf
from analysis.advice import ADVISOR_TOP, Advice, advisor_lines, render_trials
from analysis.compare import OUTPUT, PairResult
from analysis.int16_trials import Trial
from analysis.range_flags import RangeFlag


def _flag(i: int) -> RangeFlag:
    return RangeFlag(f"enc.{i}.output", "add", "residual add", 200.0, 2.0, 0.7, 1.6, "enc.x")


def _advice(n: int = ADVISOR_TOP + 3) -> Advice:
    flags = [_flag(i) for i in range(n)]
    trials = [Trial(f.layer_id, (f.layer_id,), "cosine", 0.5, 0.5 + 0.01 * i)
              for i, f in enumerate(flags)]  # fmt: skip
    trials.append(Trial("residual adds", tuple(f.layer_id for f in flags), "cosine", 0.5, 0.95))
    trials.append(Trial("needed", ("enc.1.output", "enc.2.output"), "cosine", 0.5, 0.9))
    return Advice(flags, sorted(trials, key=lambda t: -t.gain), probes=4)


def test_advisor_lists_top_n_by_measured_gain_and_says_how_many_were_left_out():
    lines = advisor_lines(_advice())
    flagged = [line for line in lines if line.startswith("enc.")]
    assert len(flagged) == ADVISOR_TOP
    assert flagged[0].startswith(f"enc.{ADVISOR_TOP + 2}.output |")  # the largest gain
    assert "0.5 -> 0.62 (+0.12) alone" in flagged[0]
    assert flagged[0].endswith(f"quant.overrides: {{enc.{ADVISOR_TOP + 2}.output: int16}}")
    assert "3 more flagged layer(s) left out" in "\n".join(lines)


def test_recommends_the_fewest_overrides_that_restore_most_of_the_best():
    """needed (2 overrides, +0.4) restores 89% of the residual adds' +0.45 with 13: it wins."""
    text = "\n".join(advisor_lines(_advice()))
    assert "# recommended: needed in int16, 2 override(s)" in text
    assert "the most restoring: residual adds, 13 override(s), -> 0.95" in text
    assert "#     enc.1.output: int16\n#     enc.2.output: int16" in text


def test_leave_one_out_losses_rank_before_the_gain_alone():
    advice = _advice(3)
    advice.losses = {"enc.0.output": 0.3, "enc.1.output": 0.0, "enc.2.output": 0.1}
    flagged = [line for line in advisor_lines(advice) if line.startswith("enc.")]
    assert [line.split(" | ")[0] for line in flagged] == ["enc.0.output", "enc.2.output",
                                                         "enc.1.output"]  # fmt: skip
    assert "all flagged lose 0.3 without it" in flagged[0]


def test_trials_section_says_it_ran_on_the_probe_frames_only():
    text = render_trials(_advice())
    assert "first 4 probe frame(s) only (not every frame)" in text
    assert text.splitlines()[2].startswith("residual adds | enc.0.output, enc.1.output")


def test_the_vendor_advisor_file_carries_the_measured_lines():
    r = PairResult("prepare", "calibrate", layer_ids=["conv"], steps={"conv": 0.1, OUTPUT: 0.1})
    agg = {"base_min": -1.0, "base_max": 1.0, "analysis_min": -1.0, "analysis_max": 1.0,
           "base_var": 0.3}  # fmt: skip
    r.aggregates = {"conv": agg, OUTPUT: agg}
    text = vf.advisor(r, {}, {}, _advice(2))
    assert "enc.1.output | add | residual add (stream from enc.x)" in text
    assert "no abnormal layer found" not in text
