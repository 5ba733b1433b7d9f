"""benchmarks/e2e.py on the CPU with tiny configs: the harness only (no timing is asserted). Every method that
can run here gives the stock loss within 1e-5 in float32, before and after one optimizer step and at every
length; the ones that cannot (Liger without CUDA, CCE without its transformers patch) are reported as skipped
with the reason; the longest-fit search, its out-of-memory handling and the merge of partial results."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import e2e  # noqa: E402

TOL = 1e-5


def _run(tmp_path, *extra, stem="e2e"):
    rc = e2e.main(["--device", "cpu", "--dtype", "float32", "--models", "tiny-qwen2", "--lengths", "32,64",
                   "--cap", "128", "--granularity", "32", "--out", str(tmp_path), "--stem", stem, *extra])
    assert rc == 0
    return json.loads((tmp_path / f"{stem}.json").read_text())


def test_methods_match_stock_or_are_reported_skipped(tmp_path):
    data = _run(tmp_path, "--grpo", "tiny-qwen2", "--grpo-lengths", "32")
    for suffix in ("json", "md", "png"):
        assert (tmp_path / f"e2e.{suffix}").stat().st_size > 0
    run = data["runs"][0]
    assert run["versions"]["torch"] == torch.__version__ and run["environment"]["commit"]
    methods = data["models"]["tiny-qwen2"]["methods"]
    assert list(methods) == list(e2e.METHODS)  # none dropped, skipped or not
    stock = methods["stock"]
    assert stock["status"] == "ok", stock
    ran = []
    for name, res in methods.items():
        why = e2e.method_problem(name, "qwen2", torch.device("cpu"))
        if why is not None:  # cannot run here: reported so, with the reason
            assert res == {"status": "skipped", "reason": why}, res
            continue
        assert res["status"] == "ok", res
        assert "undo" not in res  # the patch was undone and the modeling module left as it was
        assert abs(res["loss_after_step"] - stock["loss_after_step"]) <= TOL
        assert abs(res["loss_step1"] - stock["loss_step1"]) <= TOL
        assert res["loss_after_step"] < res["loss_step1"]  # the optimizer step used the gradients
        assert set(res["lengths"]) == {"32", "64"}
        for n, row in res["lengths"].items():
            assert abs(row["loss"] - stock["lengths"][n]["loss"]) <= TOL, (name, n)
            assert row["tokens_per_s"] > 0 and len(row["step_s"]) == 2
        assert res["longest"]["above_cap"] and res["longest"]["longest"] == 128
        ran.append(name)
    assert ran[:2] == ["stock", "fused_lce"]
    if e2e.method_problem("liger", "qwen2", torch.device("cpu")) is not None:
        assert "CUDA" in methods["liger"]["reason"] or "not importable" in methods["liger"]["reason"]
    md = (tmp_path / "e2e.md").read_text()
    for name, res in methods.items():
        if res["status"] == "skipped":
            assert f"| {name} | skipped: {res['reason'][:60]}" in md
    grpo = data["models"]["tiny-qwen2"]["grpo"]["methods"]
    ref, ours = grpo["stock"]["32"], grpo["fused_lce"]["32"]
    assert abs(ours["mean_logprob"] - ref["mean_logprob"]) <= TOL
    assert abs(ours["mean_logprob_after_step"] - ref["mean_logprob_after_step"]) <= TOL
    assert ours["mean_logprob_after_step"] != ours["mean_logprob"]


def test_out_of_memory_is_caught_and_the_longest_fit_found(tmp_path, monkeypatch):
    """A step over 80 tokens fails as the CPU allocator does: the larger timed length is recorded as OOM, the
    search brackets 80 at the granularity, and the method's patch is still undone."""
    real = e2e.lm_step

    def step(model, opt, ids):
        if ids.shape[1] > 80:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
        return real(model, opt, ids)

    monkeypatch.setattr(e2e, "lm_step", step)
    data = _run(tmp_path, "--methods", "stock,fused_lce", "--lengths", "32,96", "--granularity", "16",
                "--steps", "1")
    for res in data["models"]["tiny-qwen2"]["methods"].values():
        assert res["status"] == "ok" and res["lengths"]["96"] == {"oom": True}
        s = res["longest"]
        assert (s["longest"], s["oom_at"], s["exact"]) == (80, 96, True), s
        assert all(ok == (n <= 80) for n, ok in s["probes"])
    assert "| tiny-qwen2 | 80 (16) | 80 (16) |" in (tmp_path / "e2e.md").read_text()


@pytest.mark.parametrize("limit", [40000, 100352, 131072, 33792])
@pytest.mark.parametrize("guess", [None, 39936, 100352, 149504])  # none, right for some limits, above the cap
def test_longest_fit_search(limit, guess):
    probes = []

    def fits(n):
        probes.append(n)
        return n <= limit

    s = e2e.longest_fit(fits, 32768, None, guess, 131072, 1024)
    best = min(limit // 1024 * 1024, 131072)
    assert s["longest"] == best and len(set(probes)) == len(probes)
    assert s["above_cap"] if limit >= 131072 else (s["exact"] and s["oom_at"] == best + 1024)
    if guess is not None and (guess == best or (guess >= 131072 <= limit)):
        assert len(probes) <= 2  # a right prediction costs at most two probes
    assert len(probes) <= 12


def test_search_stops_at_the_time_limit_and_predictions():
    s = e2e.longest_fit(lambda n: True, 4096, None, None, 65536, 1024,
                        can_probe=lambda n: "time limit" if n > 16384 else None)
    assert (s["longest"], s["stopped"], s["exact"]) == (16384, "time limit", False)
    gib = 2**30
    # a peak of 10 + n/1000 GiB with 50 GiB of room: 40000 tokens
    points = [(4096, (10 + 4.096) * gib), (8192, (10 + 8.192) * gib)]
    assert e2e.predicted_fit(points, 50 * gib, 1024) == 39936
    assert e2e.predicted_fit([(4096, None)], 50 * gib, 1024) is None
    t = e2e.time_model([(1000, 1.0), (2000, 3.0)])  # a n + b n^2 through both points
    assert abs(t(1000) - 1.0) < 1e-9 and abs(t(2000) - 3.0) < 1e-9 and t(4000) > 2 * t(2000)


def test_merge_of_partial_runs(tmp_path):
    a = _run(tmp_path, "--methods", "stock", "--no-search", "--steps", "1", stem="a")
    b = _run(tmp_path, "--methods", "fused_lce", "--no-search", "--steps", "1", stem="b")
    rc = e2e.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path),
                   "--stem", "all"])
    assert rc == 0
    merged = json.loads((tmp_path / "all.json").read_text())
    assert merged["runs"] == a["runs"] + b["runs"]
    assert list(merged["models"]["tiny-qwen2"]["methods"]) == ["stock", "fused_lce"]
    assert (tmp_path / "all.md").exists() and (tmp_path / "all.png").exists()
    md = (tmp_path / "all.md").read_text()
    assert md.count("- run:") == 2 and "| fused_lce |" in md and "not searched" in md


def test_undo_check_sees_patches_not_warning_registries(monkeypatch):
    model = e2e.build_model("tiny-qwen2", "cpu", torch.float32, 0, 64)
    before = e2e.module_state(model)
    mod = sys.modules[type(model).__module__]
    monkeypatch.setitem(vars(mod), "__warningregistry__", {"version": 1})  # a warning issued there
    assert e2e.module_state(model) == before
    monkeypatch.setattr(mod, "apply_rotary_pos_emb", lambda *a: a)  # a class-level patch left behind
    assert e2e.module_state(model) != before
    monkeypatch.undo()
    model.forward = lambda *a, **k: None  # an instance patch left behind
    assert e2e.module_state(model) != before
    e2e.undo_method("cce", model)
    assert e2e.module_state(model) == before


def test_readme_table_comes_from_the_committed_result():
    """Every cell of the README's whole-step table (tokens/s / peak GiB at 16K tokens, the longest fits) is
    the committed benchmarks/results/e2e.json rounded as printed."""
    with open(os.path.join(ROOT, "benchmarks", "results", "e2e.json")) as f:
        models = json.load(f)["models"]
    readme = open(os.path.join(ROOT, "README.md")).read()
    rows = [line for line in readme.splitlines() if line.startswith("| Qwen")]
    names = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-1.7b-vocab248k", "qwen3-4b", "qwen2.5-7b"]
    assert len(rows) == len(names)
    for row, name in zip(rows, names):
        cells = [c.strip().replace("**", "") for c in row.strip("|").split("|")]
        methods = models[name]["methods"]
        for cell, method in zip(cells[1:5], ("stock", "fused_lce", "liger", "cce")):
            at = methods[method]["lengths"]["16384"]
            assert cell == f"{at['tokens_per_s']:.0f} / {at['peak_gib']:.1f}", (name, method, cell)
        longest = []
        for method in ("stock", "fused_lce"):
            fit = methods[method]["longest"]
            if fit["exact"]:
                longest.append(str(fit["longest"]))
            elif fit["oom_at"] is not None:
                longest.append(f"< {fit['oom_at']}")
            else:
                longest.append(f"≥ {fit['longest']}")
        assert cells[5] == " / ".join(longest), (name, cells[5])
