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
    for r in rows:  # the float64 check runs at the smallest size
        if r["tokens"] == 6:
            assert r["loss_abs_err"] < 1e-4 and r["dx_rel_err"] < 1e-4 and r["dw_rel_err"] < 1e-4, r
        else:
            assert "loss_abs_err" not in r and r["loss"] > 0, r
    assert data["environment"]["torch"] and "backend_info" in data
    assert out_png.stat().st_size > 1000


def test_default_is_a_token_sweep_of_plain_against_the_auto_backend(capsys):
    """The main job a newcomer runs first: plain against the backend fused_lce picks, at 256, 512 and 1024
    tokens (the head shrunk here, the tokens kept), ending in a summary line; --backends all adds every
    backend."""
    from fused_lce.core import registry

    rc = cli.main(["bench", "--quiet", "--hidden", "8", "--vocab", "64", "--no-check"])
    assert rc == 0
    text = capsys.readouterr().out
    auto = registry.auto_choice("cpu")
    for n in (256, 512, 1024):
        assert f"| {n} | plain |" in text and f"| {n} | {auto} |" in text
    assert text.strip().splitlines()[-1].startswith(f"summary: {auto} ")
    rc = cli.main(["bench", "--quiet", "--hidden", "8", "--vocab", "64", "--no-check", "--tokens", "16",
                   "--backends", "all"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| 16 | torch |" in text and "| 16 | plain |" in text


def test_summary_says_how_much_less_extra_memory():
    from fused_lce.tools import bench

    rows = [{"tokens": n, "path": p, "ms": ms, "peak_extra_mib": mib} for n, p, ms, mib in
            [(256, "plain", 10.0, 860.0), (1024, "plain", 40.0, 1784.0), (256, "cpp", 9.0, 668.0),
             (1024, "cpp", 36.0, 668.0), (1024, "torch", 1.0, 1.0), (256, "torch", 1.0, 1.0)]]
    rows.append({"tokens": 2048, "path": "plain", "error": "out of memory: ..."})
    lines = bench.summary(rows)
    assert lines[0] == ("summary: cpp needs 2.7x less extra memory than plain at 1024 tokens "
                        "(668 vs 1784 MiB; per extra token: plain +1.20 MiB, cpp +0.00 MiB), "
                        "0.90x plain's time")
    assert lines[1].startswith("summary: torch needs 1784.0x less extra memory")


def test_is_oom_recognises_cuda_and_cpu_allocators():
    from fused_lce.tools.bench import is_oom

    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory"))


def _capped(code_or_args, cap_bytes, timeout=300):
    """Runs the CLI (a list of arguments) or Python code (a str) in a fresh process under an address-space
    cap."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    cmd = ([sys.executable, "-c", code_or_args] if isinstance(code_or_args, str) else
           [sys.executable, "-m", "fused_lce.tools.cli", "bench", "--quiet"] + code_or_args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


GIB = 2**30


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS caps the address space on Linux")
def test_sizes_that_cannot_fit_end_in_a_clear_message():
    """Checked against the memory available before anything is allocated: the message says what would fit, the
    exit status is 1, no traceback; and the size it suggests does run under the same cap."""
    out = _capped(["--tokens", "1000000", "--hidden", "4096", "--vocab", "151936"], 4 * GIB)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "would not fit" in out.stderr and "lower --vocab or --hidden" in out.stderr, out.stderr
    out = _capped(["--backends", "plain", "--tokens", "20000"], 4 * GIB)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    fit = int(out.stderr.split("up to ")[1].split(" tokens would fit")[0])
    assert 64 <= fit < 20000, out.stderr
    out = _capped(["--backends", "plain", "--tokens", str(fit), "--no-check", "--warmup", "0"], 4 * GIB)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"| {fit} | plain |" in out.stdout


OOM_WITHOUT_ESTIMATE = """
import sys
from fused_lce.tools import bench, cli
bench.available_bytes = lambda device: None  # no estimate: the allocator itself runs out
sys.exit(cli.main(["bench", "--quiet", "--backends", "plain", "--tokens", "20000", "--no-check",
                   "--warmup", "0"]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS caps the address space on Linux")
def test_cpu_out_of_memory_is_reported_like_cuda_s():
    out = _capped(OOM_WITHOUT_ESTIMATE, 4 * GIB)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "plain at 20000 tokens: out of memory" in out.stderr and "out of memory (below)" in out.stdout


def test_env_and_module_entry_points():
    out = subprocess.run([sys.executable, "-m", "fused_lce.tools.cli", "env"], capture_output=True,
                         text=True, check=True)
    info = json.loads(out.stdout)
    assert info["backends"]["torch"]["available"] is True
    help_text = subprocess.run([sys.executable, "-m", "fused_lce.tools.bench", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "--preset" in help_text and "--tokens" in help_text and "--plot" in help_text


# ---------------------------------------------------------------------------------------------- bad arguments
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
    """The exit status and the absence of a traceback, as a user sees them: --tokens abc, --device cuda
    without CUDA (cuda:99 with it), and --plot without matplotlib, which must fail before the run, not after
    it."""
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_NO_MATPLOTLIB)
    device = "cuda:99" if torch.cuda.is_available() else "cuda"
    cases = [(["--tokens", "abc"], {}, "--tokens"), (["--device", device], {}, "--device"),
             (["--plot", str(tmp_path / "p.png"), "--tokens", "64", "--hidden", "8", "--vocab", "64",
               "--repeat", "1"],
              {"PYTHONPATH": str(tmp_path / "fake")}, "--plot")]
    for args, env, option in cases:
        out = subprocess.run([sys.executable, "-m", "fused_lce.tools.cli", "bench", "--quiet"] + args,
                             capture_output=True, text=True, timeout=300, env={**os.environ, **env})
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
