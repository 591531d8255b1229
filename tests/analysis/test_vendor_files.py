"""The vendor-style files: compare_per_layer_out columns, sensitive ops, the advisor."""

from __future__ import annotations

import csv
import io

import numpy as np

from analysis import vendor_files as vf
from analysis.compare import OUTPUT, PairResult
from analysis.layer_graph import Layer
from analysis.localize import PairVerdict
from analysis.own_error import OwnErrors
from analysis.quant_parts import quantization_parts

LAYERS = {
    "conv": Layer("conv", "conv", 0, ("input:x",)),
    "relu": Layer("relu", "relu", 1, ("conv",)),
}
DTYPES = {"input:x": "int8", "conv": "int8", "relu": "int8"}


def _agg(lo=-1.0, hi=1.0, var=0.3, qdiff=0.5, **kw) -> dict:
    base = {"cosine": 1.0, "mse": 0.0, "l1": 0.0, "kl": 0.01, "sqnr_db": 40.0, "max_abs": 0.1}
    base |= {"rtol": 0.1, "base_min": lo, "base_max": hi, "base_mean": 0.0, "base_var": var}
    base |= {"analysis_min": lo, "analysis_max": hi, "analysis_mean": 0.0, "analysis_var": var}
    return base | {"max_qscale_diff": qdiff, "base_nan_count": 0} | kw


def _result(aggs: dict[str, dict], step=1 / 127) -> PairResult:
    ids = [k for k in aggs if k != OUTPUT]
    r = PairResult("export", "convert", layer_ids=ids, steps=dict.fromkeys([*aggs], step))
    r.aggregates = aggs
    r.shapes = dict.fromkeys(aggs, (1, 4, 8, 8))
    return r


def _verdict(own: dict[str, float], exact=True) -> PairVerdict:
    v = PairVerdict("export", "convert", reasons=["x"], tolerance=1.0)
    v.own = OwnErrors(own, {}, exact)
    return v


def test_compare_file_has_the_vendor_columns_shape_kl_rtol_var():
    r = _result({"conv": _agg(var=0.25, rtol=0.05), OUTPUT: _agg()})
    txt, text = vf.render_compare(vf.compare_rows(r, LAYERS, DTYPES, None))
    rows = list(csv.DictReader(io.StringIO(text)))
    for col in ("shape", "KL", "Rtol", "base_var", "analy_var"):
        assert col in rows[0], col
    assert rows[0]["shape"] == "[1, 4, 8, 8]" and float(rows[0]["Rtol"]) == 0.05
    assert float(rows[0]["KL"]) == 0.01 and float(rows[0]["analy_var"]) == 0.25
    header = txt.splitlines()[0].split(" | ")
    assert header[:4] == ["mod_name", "base_op_type", "analy_op_type", "shape"]


def test_no_int16_advice_from_a_layers_spread_or_error_alone():
    """The old rules advised int16 for a wide spread or a large error on nearly every
    layer of a transformer; int16 is now advised only from measured trials."""
    aggs = {"conv": _agg(lo=-100.0, hi=100.0, var=0.5**2, qdiff=9.0), "relu": _agg(qdiff=9.0)}
    text = vf.advisor(_result({**aggs, OUTPUT: _agg()}, step=100 / 127), LAYERS, DTYPES)
    assert "int16" not in text and "no abnormal layer found" in text


def test_an_int8_layer_reaching_128_is_advised_int16_any_layer_not_only_inputs():
    r = _result({"input:x": _agg(lo=-10.0, hi=200.0, var=3000.0), OUTPUT: _agg()}, step=2.0)
    assert "reaches |x| 200 >= 128 in int8 (a step of 1.57 or more) | consider int16" in (
        vf.advisor(r, LAYERS, DTYPES)
    )
    wide = _result({"conv": _agg(lo=-150.0, hi=20.0, var=900.0), OUTPUT: _agg()}, step=1.2)
    assert "conv | conv | data range reaches |x| 150 >= 128 in int8" in (
        vf.advisor(wide, LAYERS, DTYPES)
    )
    small = _result({"input:x": _agg(lo=-1.0, hi=1.0), OUTPUT: _agg()})
    assert ">= 128" not in vf.advisor(small, LAYERS, DTYPES)


def test_clipping_by_calibration_is_not_an_uncovered_scale_but_unquantized_values_are():
    """The rule reads the quantized side, as the vendor's does: float values past a
    calibrated (mse, percentile) scale are clipping on purpose; calibrated values past the
    scale's range mean its fake quant did nothing."""
    step = 0.01
    clipped = _agg(lo=-0.5, hi=1.53, var=0.08, analysis_min=-0.5, analysis_max=127 * step)
    r = _result({"conv": clipped, OUTPUT: _agg()}, step=step)
    r.base, r.analysis = "prepare", "calibrate"
    text = vf.advisor(r, LAYERS, DTYPES)
    assert text.startswith("# rules on prepare -> calibrate") and "no abnormal layer" in text
    r.aggregates["conv"] = clipped | {"analysis_max": 1.53}  # fake quant off
    assert "conv | conv | scale does not cover the data range" in vf.advisor(r, LAYERS, DTYPES)


def test_the_advisor_reads_the_float_calibrate_pair_when_the_chain_has_it():
    top = ("export", "convert")
    pairs = [("prepare", "calibrate"), ("calibrate", "pre_export"), top]
    assert vf.advisor_pair(pairs, top) == ("prepare", "calibrate")
    assert vf.advisor_pair(pairs[1:], top) == top  # a PTQ run: no float model


def test_range_rules_too_large_for_any_quantization_and_uncovered():
    aggs = {
        "conv": _agg(lo=-100.0, hi=100.0, var=0.5**2),  # the bulk in ~0.6 int8 steps
        "relu": _agg(lo=0.0, hi=1e5, var=1.0),  # < 4 int16 steps even
        OUTPUT: _agg(),
    }
    text = vf.advisor(_result(aggs, step=100 / 127), LAYERS, DTYPES)
    lines: dict[str, str] = {}
    for line in text.splitlines()[2:]:
        lines[line.split(" | ")[0]] = lines.get(line.split(" | ")[0], "") + line
    assert "conv" not in lines  # int8 carries it coarsely: for the measured trials to judge
    assert "too large for any quantization" in lines["relu"]
    assert "scale does not cover" in text  # relu's 1e5 against a step of 0.79
    offset = _agg(lo=0.5, hi=0.58, var=0.017**2)  # a sigmoid's: narrow, not too large
    fine = _result({"conv": _agg(lo=-1.0, hi=1.0, var=0.2), "relu": offset, OUTPUT: _agg()})
    assert "no abnormal layer found" in vf.advisor(fine, LAYERS, DTYPES)


def test_sensitive_ops_have_type_and_flops():
    v = _verdict({"conv": 7.0, "relu": 7.0})
    v.sensitive = [("conv", 1.0, 0.1), ("relu", 1.0, 0.5)]
    v.judged = [7, 0, 1, 2, 3]
    text = vf.render_sensitive(v, LAYERS, DTYPES, {"conv": 300, "relu": 100})
    judged, header, conv, relu = text.splitlines()[1:]
    assert judged == (
        "# judged on 5 sample(s), not every frame: the pair's bad cases and the probe "
        "samples (7, 0, 1, 2, 3)"
    )
    assert header.split(" | ")[1] == "sensitive_type" and header.endswith("| flops")
    assert conv.split(" | ")[1] == "weight" and conv.endswith("| 300(75.00%)")
    assert relu.split(" | ")[1] == "activation"  # no weights of its own
    small = _verdict({"conv": 0.5})
    small.sensitive = [("conv", 1.0, 0.9)]
    assert vf.render_sensitive(small, LAYERS, DTYPES).splitlines()[3].split(" | ")[1] == (
        "activation"
    )
    assert vf.render_sensitive(small, LAYERS, DTYPES).endswith("| -\n")  # flops unknown


def test_float_pair_sensitive_type_splits_weight_and_activation_quantization():
    """float -> calibrate: a conv whose output scale clips is ``activation`` however large
    its own error; coarse weights under a covering scale are ``weight``."""
    step = 0.01
    ref = np.linspace(-1.5, 1.5, 301)  # the float conv on calibrate's inputs
    q = np.clip(np.round(ref / step), -128, 127) * step  # its output quantizer clips at 1.27
    w_clip, a_clip = quantization_parts(q, ref, step, "int8")
    assert a_clip > w_clip == 0.0
    coarse = np.round((ref * 0.8 + 0.03) / step) * step  # weights off by 20%, no clipping
    w, a = quantization_parts(coarse, ref * 0.8, step, "int8")
    assert w > a
    assert quantization_parts(ref + 0.5, ref, step, "int32") == (50.0, 0.0)  # no quantizer
    v = PairVerdict("prepare", "calibrate", reasons=["x"], tolerance=1.0)
    v.own = OwnErrors({"conv": 23.0, "relu": 23.0}, {}, True)  # both far over tolerance
    v.sensitive = [("conv", 1.0, 0.1)]
    parts = {"conv": (w_clip, a_clip)}
    assert vf.sensitive_type(v, "conv", "conv", "int8", parts) == "activation"
    assert vf.sensitive_type(v, "conv", "conv", "int8", {"conv": (w, a)}) == "weight"
    assert vf.render_sensitive(v, LAYERS, DTYPES, None, parts).splitlines()[3].split(" | ")[1] == (
        "activation"
    )
