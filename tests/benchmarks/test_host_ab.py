"""benchmarks/host_ab.py on the CPU: variant parsing, the interleaved run order and environment (the CUDA script
it runs replaced by a stand-in), and the summary of the committed round-9 runs."""
from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import host_ab  # noqa: E402


def test_variant_parsing(tmp_path):
    name, tree, env = host_ab._variant(f"eager={tmp_path}+FUSED_LCE_X=0+B=1=2")
    assert (name, tree, env) == ("eager", str(tmp_path), {"FUSED_LCE_X": "0", "B": "1=2"})
    for bad in ("noequals", "=tree", "a_b=.", "x="):
        with pytest.raises(SystemExit):
            host_ab._variant(bad)


def test_rounds_interleave_variants_and_summarise(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, env, capture_output, text, timeout):
        out = cmd[cmd.index("--out") + 1]
        op = cmd[cmd.index("--op") + 1]
        calls.append((os.path.basename(out), env["PYTHONPATH"].split(os.pathsep)[0], env.get("KNOB")))
        os.makedirs(out, exist_ok=True)
        row = {"shape": "8x8x8", "step_ms": float(len(calls)), "stamps_us": {"lce_gemm launch <": 10.0 * len(calls)}}
        with open(os.path.join(out, f"host_stamps_{op}_bfloat16.json"), "w") as f:
            json.dump({"meta": {"environment": {"commit": "abc"}}, "rows": [row]}, f)
        return type("R", (), {"stdout": "ok", "stderr": "", "returncode": 0})()

    monkeypatch.setattr(host_ab.subprocess, "run", fake_run)
    a, b = tmp_path / "a", tmp_path / "b"
    host_ab.main(["--out", str(tmp_path / "o"), "--variant", f"base={a}", "--variant", f"new={b}+KNOB=1",
                  "--ops", "logprobs_nograd", "--rounds", "2"])
    # variants alternate within each round, each with its own tree first on the path and its environment
    assert calls == [("logprobs_nograd_base_1", str(a), None), ("logprobs_nograd_new_1", str(b), "1"),
                     ("logprobs_nograd_base_2", str(a), None), ("logprobs_nograd_new_2", str(b), "1")]
    runs = json.loads((tmp_path / "o" / "host_ab.json").read_text())
    assert [r["step_ms"] for r in runs["logprobs_nograd"]["new"]] == [2.0, 4.0]
    assert runs["logprobs_nograd"]["base"][1]["marks_us"]["lce_gemm launch <"] == 30.0
    assert "| new | 2.00 / 4.00 | 3.00 |" in (tmp_path / "o" / "host_ab.md").read_text()


def test_summary_of_the_committed_runs():
    runs = host_ab.summary(os.path.join(ROOT, "benchmarks", "results", "round9", "host_ab"))
    assert set(runs) == {"logprobs", "logprobs_nograd", "loss"}
    for op in runs.values():
        assert set(op) == {"base", "compiled", "eager"}
        assert all([r["round"] for r in rows] == [1, 2, 3] for rows in op.values())
