"""``fused-lce bench`` / ``fused-lce env`` end to end on a tiny shape (no timing assertions)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fused_lce.tools import cli


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


def test_env_and_module_entry_points():
    out = subprocess.run([sys.executable, "-m", "fused_lce.tools.cli", "env"], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["backends"]["torch"]["available"] is True
    help_text = subprocess.run([sys.executable, "-m", "fused_lce.tools.bench", "--help"], capture_output=True, text=True,
                               check=True).stdout
    assert "--preset" in help_text and "--tokens" in help_text and "--plot" in help_text


# ------------------------------------------------------------------------------------------------ bad arguments
BAD_ARGS = [  # (arguments, the option the usage error must name)
    (["--tokens", "abc"], "--tokens"),
    (["--tokens", "0"], "--tokens"),
    (["--tokens", "-5"], "--tokens"),
    (["--tokens", "8,,x"], "--tokens"),
    (["--tokens", ","], "--tokens"),
    (["--repeat", "0"], "--repeat"),
    (["--repeat", "1.5"], "--repeat"),
    (["--warmup", "-1"], "--warmup"),
    (["--tile-mb", "-1"], "--tile-mb"),
    (["--tile-mb", "0"], "--tile-mb"),
    (["--tile-mb", "nan"], "--tile-mb"),
    (["--tile-mb", "big"], "--tile-mb"),
    (["--hidden", "0"], "--hidden"),
    (["--vocab", "0"], "--vocab"),
    (["--vocab", "x"], "--vocab"),
    (["--device", "bogus"], "--device"),
    (["--device", "meta"], "--device"),
    (["--device", "cuda:99" if torch.cuda.is_available() else "cuda"], "--device"),
    (["--device", "cpu", "--backends", "triton"], "--backends"),
    (["--backends", "plain,warp"], "--backends"),
    (["--backends", ","], "--backends"),
    (["--dtype", "float64"], "--dtype"),
    (["--preset", "gpt-5"], "--preset"),
    (["--json", "/no/such/folder/x.json"], "--json"),
]


@pytest.mark.parametrize("args,option", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_arguments_are_usage_errors(args, option, capsys, monkeypatch):
    """Every bad value is an argparse usage error (SystemExit 2, 'usage:' and the option on stderr), raised
    before any benchmark runs (the run itself must never start)."""
    from fused_lce.tools import bench

    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("the benchmark started"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--quiet"] + args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: fused-lce bench" in err and f"argument {option}" in err, err
    with pytest.raises(SystemExit) as e:  # python -m fused_lce.tools.bench parses the same way
        bench.main(["--quiet"] + args)
    assert e.value.code == 2


FAKE_NO_MATPLOTLIB = "raise ImportError('No module named matplotlib (hidden by the test)')\n"


def test_usage_errors_in_a_fresh_process(tmp_path):
    """The exit status and the absence of a traceback, as a user sees them: --tokens abc, --device cuda without
    CUDA (cuda:99 with it), and --plot without matplotlib, which must fail before the run, not after it."""
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_NO_MATPLOTLIB)
    device = "cuda:99" if torch.cuda.is_available() else "cuda"
    cases = [(["--tokens", "abc"], {}, "--tokens"), (["--device", device], {}, "--device"),
             (["--plot", str(tmp_path / "p.png"), "--tokens", "64", "--hidden", "8", "--vocab", "64", "--repeat", "1"],
              {"PYTHONPATH": str(tmp_path / "fake")}, "--plot")]
    for args, env, option in cases:
        out = subprocess.run([sys.executable, "-m", "fused_lce.tools.cli", "bench", "--quiet"] + args, capture_output=True,
                             text=True, timeout=300, env={**os.environ, **env})
        assert out.returncode == 2, (args, out.returncode, out.stderr[-2000:])
        assert "Traceback" not in out.stderr and f"argument {option}" in out.stderr, out.stderr
        assert "usage: fused-lce bench" in out.stderr and out.stdout == ""


def test_plot_without_matplotlib_fails_before_the_run(capsys, monkeypatch, tmp_path):
    from fused_lce.tools import bench

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("the benchmark started"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--quiet", "--plot", str(tmp_path / "p.png")])
    assert e.value.code == 2 and "argument --plot: needs matplotlib" in capsys.readouterr().err
