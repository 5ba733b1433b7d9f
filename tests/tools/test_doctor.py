"""``fused-lce doctor`` (fused_lce/tools/doctor.py): the CLI on this host (every section present, the
self-check of the available backends with their errors and both timings, the timing against torch, clear
argument errors), and in-process with the AscendC kernels on the CPU twin registered, so that the NPU sections
-- the self-check of the kernels and the bitwise comparison of their conservative variants -- run as they
would on a card."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fused_lce.backends.npu import AscendCProvider
from fused_lce.core import registry, selfcheck
from fused_lce.tools import doctor

from ..support.ascendc_twin import build as twin_build


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fused_lce.tools.cli", "doctor", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def test_the_report_on_this_host(tmp_path):
    r = _cli("--json", "--shape", "32x32x500", "--reps", "1", env={"FUSED_LCE_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert set(rep) == {"versions", "backends", "build", "selfcheck", "variants", "timing",
                        "backends_after_selfcheck"}
    assert rep["versions"]["torch"] == torch.__version__ and "cann" in rep["versions"]
    assert rep["backends"]["cpp"]["available"] and "reason" in rep["backends"]["npu"]
    cpp = rep["selfcheck"]["cpp on cpu"]
    assert cpp["ok"] and cpp["cases"] and 0 < cpp["errors"]["dW"] < 0.05 and cpp["seconds"] > 0
    assert cpp["cached_seconds"] is not None and cpp["cached_seconds"] < cpp["seconds"]
    assert "skipped" in rep["variants"]
    t = rep["timing"]["cpp on cpu"]
    assert t["shape"] == "32x32x500" and t["cpp_ms"] > 0 and t["torch_ms"] > 0
    text = doctor.render(rep)  # what `fused-lce doctor` prints without --json
    assert "== selfcheck" in text and "cpp on cpu" in text and "== timing" in text


@pytest.mark.parametrize("args,msg", [(["--shape", "12x3"], "--shape: expected NxDxV"),
                                      (["--shape", "0x3x4"], "--shape: every size must be >= 1"),
                                      (["--reps", "0"], "--reps: expected an integer >= 1"),
                                      (["--backends", "cpp,gpu"], "--backends: unknown backend 'gpu'")])
def test_bad_arguments_are_usage_errors(args, msg, capsys):
    from fused_lce.tools import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and "Traceback" not in err, err


class DriftingVariant(twin_build.TwinKernels):
    """Kernels whose conservative variants disagree with the default in the last bit of dX (what a card could
    show if the default's pipe order or L1 residency were wrong)."""

    def grads(self, *args, **kw):
        dx, dw, db = super().grads(*args, **kw)
        return (dx * (1 + 2**-20) if self.variant else dx), dw, db


@pytest.mark.twin
@pytest.mark.parametrize("kernels,equal", [(twin_build.TwinKernels, True), (DriftingVariant, False)],
                         ids=["twin", "drifting"])
def test_the_npu_sections_with_the_kernels_on_the_twin(kernels, equal, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSED_LCE_CACHE_DIR", str(tmp_path))
    selfcheck.forget()
    registry.register(AscendCProvider("npu_doctor", kernels=kernels(), device_types=("cpu",)))
    try:
        rep = doctor.collect(timing=False, only=["npu_doctor"])
    finally:
        registry.unregister("npu_doctor")
        selfcheck.forget()
    check = rep["selfcheck"]["npu_doctor on cpu"]  # the default kernels: a pass with every output's error
    assert check["ok"] and set(check["errors"]) >= {"loss", "dX", "dW", "db", "logprob", "entropy"}, check
    rows = {k: v for k, v in rep["variants"].items() if k.startswith("npu_doctor on cpu")}
    assert sorted(v["variant"] for v in rows.values()) == sorted(doctor.VARIANTS.values())
    for row in rows.values():
        assert row["bitwise_equal"] is equal, row
        assert len(row["cases"]) == len(selfcheck.BATTERY)
        if not equal:  # only dX moved (in 16-bit dX the drift may round away)
            assert all(set(c["max_abs_diff"]) <= {"dX"} for c in row["cases"]), row["cases"]
            assert any(c["max_abs_diff"] for c in row["cases"])
