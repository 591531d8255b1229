"""The vendor-style files: compare_per_layer_out columns, sensitive ops, the advisor."""

from __future__ import annotations

import csv
import io

from analysis import vendor_files as vf
from analysis.compare import OUTPUT, PairResult
from analysis.layer_graph import Layer
from analysis.localize import PairVerdict
from analysis.own_error import OwnErrors

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


def test_an_int8_input_spanning_128_or_more_is_advised_int16():
    r = _result({"input:x": _agg(lo=-10.0, hi=200.0, var=3000.0), OUTPUT: _agg()}, step=2.0)
    text = vf.advisor(r, LAYERS, DTYPES)
    assert "input range 210 >= 128 in int8 | consider int16" in text
    small = _result({"input:x": _agg(lo=-1.0, hi=1.0), OUTPUT: _agg()})
    assert "input range" not in vf.advisor(small, LAYERS, DTYPES)


def test_range_rules_too_large_for_any_quantization_and_uncovered():
    aggs = {
        "conv": _agg(lo=-100.0, hi=100.0, var=0.5**2),  # the bulk in ~0.6 int8 steps
        "relu": _agg(lo=0.0, hi=1e5, var=1.0),  # < 4 int16 steps even
        OUTPUT: _agg(),
    }
    text = vf.advisor(_result(aggs, step=100 / 127), LAYERS, DTYPES)
    lines: dict[str, str] = {}
    for line in text.splitlines()[1:]:
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
    text = vf.render_sensitive(v, LAYERS, DTYPES, {"conv": 300, "relu": 100})
    header, conv, relu = text.splitlines()[1:]
    assert header.split(" | ")[1] == "sensitive_type" and header.endswith("| flops")
    assert conv.split(" | ")[1] == "weight" and conv.endswith("| 300(75.00%)")
    assert relu.split(" | ")[1] == "activation"  # no weights of its own
    small = _verdict({"conv": 0.5})
    small.sensitive = [("conv", 1.0, 0.9)]
    assert vf.render_sensitive(small, LAYERS, DTYPES).splitlines()[2].split(" | ")[1] == (
        "activation"
    )
    assert vf.render_sensitive(small, LAYERS, DTYPES).endswith("| -\n")  # flops unknown
