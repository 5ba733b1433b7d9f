"""benchmarks/npu_model.py: the cube-efficiency and per-core MTE2 parameters, the ordering of its settings on
one Qwen head (counted on the CPU twin), its argument checks, and that the committed result and the README
quote the range, with the 100%-of-peak figures only as lower bounds."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import npu_model  # noqa: E402

RESULT = os.path.join(ROOT, "benchmarks", "results", "npu_model.json")


def test_cube_tile_is_the_slower_of_mmads_and_operand_copies():
    peak_core = 1e12
    a = npu_model.Assumptions("x", 0.5, 1e9)
    assert npu_model.cube_tile(1e9, 1e6, peak_core, a) == pytest.approx(2e-3)  # MMADs at half the peak
    assert npu_model.cube_tile(1e9, 4e6, peak_core, a) == pytest.approx(4e-3)  # the copies take longer
    # no per-core limit
    assert npu_model.cube_tile(1e9, 4e6, peak_core, npu_model.PEAK) == pytest.approx(1e-3)


@pytest.mark.parametrize("argv", [["--cube-eff", "1.5", "0.7"], ["--cube-eff", "0.85", "0"],
                                  ["--mte2-gbps", "170", "-1"]])
def test_bad_arguments_are_refused_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit):
        npu_model.main(argv)
    assert argv[0] in capsys.readouterr().err


@pytest.mark.twin
def test_settings_order_on_one_head(monkeypatch):
    """On the 4096 x 3584 x 152064 head: the peak setting is a lower bound of the range, the low end at or
    above the high end for every route, and a setting at 100% with no copy limit is the peak setting."""
    from tests.support.ascendc_twin import build as twin_build

    monkeypatch.setattr(npu_model, "SHAPES", [(4096, 3584, 152064)])
    ops = twin_build.load_twin()
    counted = {}
    res = {a.name: {r["kernels"]: r for r in npu_model.model_rows(ops, a, counted)}
           for a in (npu_model.PEAK, npu_model.HIGH, npu_model.LOW,
                     npu_model.Assumptions("same", 1.0, math.inf))}
    for k in npu_model.NAMES:
        assert res["peak"][k]["ratio"] <= res["high"][k]["ratio"] <= res["low"][k]["ratio"], k
        assert res["same"][k]["modeled_ms"] == res["peak"][k]["modeled_ms"], k
    assert res["peak"]["onepass"]["ratio"] < res["peak"]["dz_kept"]["ratio"] < res["peak"]["cube"]["ratio"]
    assert res["high"]["onepass"]["fwd_ms"] == pytest.approx(res["peak"]["onepass"]["fwd_ms"] / 0.85,
                                                             rel=0.02)


def _ranges():
    with open(RESULT) as f:
        data = json.load(f)
    out = {}
    for r in data["summary"]:
        lo = out.setdefault(r["kernels"], {"peak": [], "high": [], "low": []})
        for s in lo:
            lo[s].append(r[f"ratio_{s}"])
    return data, out


def test_committed_result_has_every_setting_in_order():
    data, ranges = _ranges()
    assert [a["name"] for a in data["meta"]["assumptions"]] == ["peak", "high", "low"]
    assert set(ranges) == set(npu_model.NAMES)
    for r in data["summary"]:
        assert r["ratio_peak"] <= r["ratio_high"] <= r["ratio_low"], r


def test_readme_quotes_the_range():
    _, ranges = _ranges()
    readme = open(os.path.join(ROOT, "README.md")).read()
    for route in ("onepass", "dz_kept", "cube"):
        r = ranges[route]
        assert f"{min(r['high']):.2f}–{max(r['low']):.2f}×" in readme, route
    onepass_peak = f"{min(ranges['onepass']['peak']):.2f}–{max(ranges['onepass']['peak']):.2f}×"
    assert onepass_peak in readme and "lower bounds, not" in readme  # the best case only as a lower bound
