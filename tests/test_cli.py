"""``fused-lce bench`` / ``fused-lce env`` end to end on a tiny shape (no timing assertions)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fused_lce import cli


def test_bench_json_and_plot(tmp_path, capsys):
    out_json = tmp_path / "b.json"
    out_png = tmp_path / "b.png"
    rc = cli.main(["bench", "--tokens", "24", "--hidden", "16", "--vocab", "301", "--repeat", "1", "--quiet",
                   "--json", str(out_json), "--plot", str(out_png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| tokens | path |" in text and "plain" in text and "torch" in text
    data = json.loads(out_json.read_text())
    rows = data["results"]
    assert {r["tokens"] for r in rows} == {6, 12, 24}  # --plot with one size sweeps N/4, N/2, N
    for r in rows:
        assert r["loss_abs_err"] < 1e-4 and r["dx_rel_err"] < 1e-4 and r["dw_rel_err"] < 1e-4, r
    assert data["environment"]["torch"] and "backend_info" in data
    assert out_png.stat().st_size > 1000


def test_bench_rejects_bad_arguments():
    with pytest.raises(SystemExit):
        cli.main(["bench", "--tokens", "0"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "--backends", "plain,warp"])


def test_env_and_module_entry_points():
    out = subprocess.run([sys.executable, "-m", "fused_lce.cli", "env"], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["backends"]["torch"]["available"] is True
    help_text = subprocess.run([sys.executable, "-m", "fused_lce.bench", "--help"], capture_output=True, text=True,
                               check=True).stdout
    assert "--preset" in help_text and "--tokens" in help_text and "--plot" in help_text
