"""benchmarks/gpu.py on the CPU: the result files it writes from a run's measurements (those need CUDA)."""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu  # noqa: E402


def _row(ms, gib, err=1e-3):
    return {"ms": ms, "peak_extra_gib": gib, "loss_abs_err": 1e-6, "dx_rel_err": err, "dw_rel_err": err}


def _result():
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "commit": "abc1234"}
    oom = {"error": "RuntimeError: out of memory"}
    shapes = [{"n": 8192, "d": 4096, "v": 151936, "dtype": "bfloat16", "floor_ms": 40.0, "min_gib": 1.22,
               "results": {"fused_lce": _row(39.0, 3.2), "cce_torch_compile": _row(41.0, 3.2),
                           "torch_eager": _row(58.0, 13.9), "liger": oom}},
              {"n": 2048, "d": 1536, "v": 151936, "dtype": "bfloat16", "floor_ms": 3.8, "min_gib": 0.44,
               "results": {"fused_lce": _row(5.1, 0.94, 2e-3), "cce_torch_compile": _row(5.0, 0.90),
                           "torch_eager": _row(7.8, 3.5), "liger": _row(42.8, 0.45)}}]
    return {"meta": {"environment": env, "gemm_tflops": 755.0, "copy_tb_s": 4.2, "knobs": {},
                     "versions": {"torch": "2.11.0+cu130", "cut_cross_entropy": "25.1.1",
                                  "quack": "not importable: ModuleNotFoundError"}},
            "methods": ["fused_lce", "cce_torch_compile", "torch_eager", "liger"], "shapes": shapes,
            "profile": {}}


def test_results_go_to_one_fixed_name_per_file():
    assert gpu.RESULTS == os.path.join(ROOT, "benchmarks", "results")


def test_write_outputs_names_device_versions_and_targets(tmp_path):
    gpu.write_outputs(_result(), str(tmp_path), show=False)
    assert sorted(os.listdir(tmp_path)) == ["gpu.json", "gpu.md", "gpu.png"]
    md = (tmp_path / "gpu.md").read_text()
    assert md.startswith("# fused_lce on NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0, commit abc1234)")
    assert "cut_cross_entropy: 25.1.1" in md and "quack: not importable" in md
    assert "| 8192x4096x151936 bfloat16 | 40.0 | 1.22 | 39.0 (0.97) / 3.20 | 41.0 (1.02) / 3.20 |" in md
    assert "RuntimeError: out of memory" in md
    targets = {t["shape"]: t for t in json.loads((tmp_path / "gpu.json").read_text())["targets"]}
    big, small = targets["8192x4096x151936 bfloat16"], targets["2048x1536x151936 bfloat16"]
    assert big["faster_than_cce_compile"] and big["mem_le_cce_compile"] and big["le_limit"]
    assert big["fastest_peer"] == "cce_torch_compile" and big["grad_err_le_eager"]
    assert not small["faster_than_cce_compile"] and not small["mem_le_cce_compile"]
    assert small["limit"] == 1.25 and not small["le_limit"] and not small["grad_err_le_eager"]
