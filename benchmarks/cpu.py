"""CPU benchmark of fused_lce's "cpp" (and "torch") providers against eager PyTorch and torch 2.13's
F.linear_cross_entropy on wide LM heads, in float32, bfloat16 and float16.

Shapes (N x D x V): D = 2048, 3584, 4096 at V = 151936 (Qwen heads) and D = 2304 at V = 256000 (Gemma-2-2B's
vocabulary); N = 128 tokens, so that the whole run stays near 20 minutes on 2 shared cores. For every (shape,
dtype):
  - one child makes the inputs (fused_lce.tools.bench.make_inputs: N(0, 1) hidden, N(0, 1/D) weight, 15% of
    labels -100), saves them for the method children (which load them instead of regenerating: most of a
    child's time otherwise) and computes the float64 mean loss of those (rounded) inputs over vocabulary
    chunks (no float64 copy of W; fused_lce.core.formulas.reference_mean_loss_grads would also build a float64
    dW, 10 GiB at the widest head);
  - every method runs in its own fresh subprocess (so its peak RSS is its own), --rounds children per method
    with the methods interleaved (round 1: eager, fused_cpp, torch_lce, fused_torch; round 2: fused_cpp,
    eager, i.e. --repeat-methods in reverse; eager runs next to ours under the same load), each child --reps
    fwd+bwd of the mean loss w.r.t. hidden and weight. Recorded per child: wall and process CPU seconds of
    every run, the 1-minute load average before and after, peak RSS (getrusage max RSS minus the RSS after
    loading the inputs: gradients and temporaries), the loss (relative error vs float64:
    fused_lce.tools.bench's rel_err of the scalars).
Methods: eager (F.linear + F.cross_entropy in the input dtype, logits upcast to float32 as HF does), torch_lce
(torch 2.13's F.linear_cross_entropy(options=torch.nn.LinearCrossEntropyOptions()): chunked), fused_torch (our
"torch" provider), fused_cpp (our "cpp" provider). Where oneDNN has no bf16 / fp16 matmul on this CPU
(torch.ops.mkldnn._is_mkldnn_bf16_supported() false), ATen multiplies 16-bit matrices with its fallback
kernels (measured here: ~0.5 GFLOP/s for dZ @ W): the methods running on those ("slow": eager, torch_lce and,
when asked for, fused_torch in bf16 / fp16) get one child with --slow-timeout seconds, torch_lce in float32
one with --lce-timeout; a timeout is recorded as a lower bound on their time (the seconds from the start of
their first fwd+bwd to the kill), so "x eager" is then an upper bound; `--extrapolate cpu.json` then times
eager on the first V / 16 vocabulary rows of those cases (labels folded into them) and "x eager" uses 16 x
that time, marked "est." (every GEMM and the cross-entropy are linear in V).

    python benchmarks/cpu.py                                     # the full run, results in benchmarks/results
    python benchmarks/cpu.py --shapes 128x2048x151936 --dtypes float32 --methods eager fused_cpp --out /tmp/b
    python benchmarks/cpu.py --extrapolate benchmarks/results/cpu.json  # eager estimates where it timed out
    python benchmarks/cpu.py --render benchmarks/results/cpu.json  # rewrite cpu.md from a JSON
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS = 128
SHAPES = {  # N x D x V: the model whose LM head it is
    f"{TOKENS}x2048x151936": "Qwen2.5-3B / Qwen3-1.7B (D 2048)",
    f"{TOKENS}x3584x151936": "Qwen2.5-7B width (D 3584)",
    f"{TOKENS}x4096x151936": "Qwen3-8B (D 4096)",
    f"{TOKENS}x2304x256000": "Gemma-2-2B (256K vocabulary)",
}
DTYPES = ["float32", "bfloat16", "float16"]
METHODS = ["eager", "fused_cpp", "torch_lce", "fused_torch"]
# 16-bit: fused_torch multiplies with the same ATen kernels as eager (slow without oneDNN bf16 / fp16): not
# run by default there, to keep the run short; --methods adds it
DEFAULT_METHODS = {"float32": METHODS, "bfloat16": METHODS[:3], "float16": METHODS[:3]}
GIB = 2**30
SLICE = 16  # eager in slow 16-bit cases is also timed on V / SLICE vocabulary rows, its times scaled by SLICE


def loadavg():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def method_fn(name):
    import torch
    import torch.nn.functional as F

    if name == "eager":
        return lambda h, w, y: F.cross_entropy(F.linear(h, w).float(), y)
    if name == "torch_lce":
        opts = torch.nn.LinearCrossEntropyOptions()
        return lambda h, w, y: F.linear_cross_entropy(h, w, y, options=opts)
    import fused_lce

    backend = {"fused_torch": "torch", "fused_cpp": "cpp"}[name]
    return lambda h, w, y: fused_lce.linear_cross_entropy(h, w, y, backend=backend)


def child_case(method, inputs, reps):
    """One method on the saved inputs in this (fresh) process; prints a start line, then one JSON line."""
    import torch

    h, w, y = torch.load(inputs)
    if method == "eager_slice":  # eager on the first V / SLICE vocabulary rows (labels folded into them)
        vs = w.shape[0] // SLICE
        w = w[:vs].clone()
        y = torch.where(y >= 0, y % vs, y)
        method = "eager"
    h.requires_grad_()
    w.requires_grad_()
    fn = method_fn(method)
    base = rss_now()
    load0 = loadavg()
    print(json.dumps({"started": time.time()}), flush=True)  # a timed-out parent's lower bound starts here
    walls, cpus, loss = [], [], None
    for _ in range(reps):
        h.grad = w.grad = None
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn(h, w, y)
        out.backward()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        loss = float(out.detach())
        del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    finite = bool(torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all())
    print(json.dumps({"walls": walls, "cpus": cpus, "peak_extra_gib": (peak - base) / GIB, "loss": loss,
                      "grads_finite": finite, "load_before": load0, "load_after": loadavg()}), flush=True)


def child_reference(n, d, v, dtype_name, inputs, chunk=8192, loss=True):
    """Makes the inputs (saved to `inputs` for the method children) and prints their float64 mean loss,
    computed over vocabulary chunks with an online logsumexp (no float64 copy of the whole weight)."""
    import torch

    from fused_lce.tools.bench import make_inputs

    h, w, y = make_inputs(n, d, v, getattr(torch, dtype_name))
    torch.save((h, w, y), inputs)
    if not loss:
        print(json.dumps({"saved": inputs}), flush=True)
        return
    h64 = h.double()
    m = torch.full((n,), -float("inf"), dtype=torch.float64)
    s = torch.zeros(n, dtype=torch.float64)
    target = torch.zeros(n, dtype=torch.float64)
    valid = y != -100
    for v0 in range(0, v, chunk):
        z = h64 @ w[v0:v0 + chunk].double().t()
        mc = torch.maximum(m, z.max(1).values)
        s = s * torch.exp(m - mc) + torch.exp(z - mc[:, None]).sum(1)
        m = mc
        inside = valid & (y >= v0) & (y < v0 + z.shape[1])
        target[inside] = z[inside, (y[inside] - v0)]
    loss = torch.where(valid, m + s.log() - target, torch.zeros_like(m)).sum() / valid.sum().clamp(min=1)
    print(json.dumps({"loss": float(loss)}), flush=True)


def run_child(args, timeout):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True, text=True,
                           env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        killed = time.time()
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        started = [json.loads(ln)["started"] for ln in out.splitlines() if ln.startswith('{"started"')]
        return {"timeout_s": timeout, "lower_bound_s": (killed - started[0]) if started else None}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{") and not ln.startswith('{"started"')]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout)[-600:]}
    return json.loads(lines[-1])


def slow_dtypes():
    """16-bit dtypes whose eager matmuls have no oneDNN kernel on this CPU (ATen's fallback kernels)."""
    import torch

    slow = []
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        slow.append("bfloat16")
    if not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        slow.append("float16")
    return slow


def machine():
    import torch

    from fused_lce.tools.bench import environment

    info = environment(torch.device("cpu"))
    info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["mkldnn_bf16"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    info["mkldnn_fp16"] = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    info["has_F_linear_cross_entropy"] = hasattr(torch.nn.functional, "linear_cross_entropy")
    try:
        from fused_lce.backends import cpp

        n, d, v = (int(x) for x in list(SHAPES)[2].split("x"))
        info["cpp_plans"] = {dt: cpp.describe(n, v, d, getattr(torch, dt)) for dt in DTYPES}
    except Exception as e:  # the benchmark still runs the other methods
        info["cpp_plans"] = f"unavailable: {e}"
    return info


def summarize(runs):
    """One method's children merged: min wall (and that run's CPU), min CPU, largest peak, loads."""
    ok = [r for r in runs if "walls" in r]
    if not ok:
        out = dict(runs[0])
        out["loads"] = [r.get("load") for r in runs]
        return out
    walls = [w for r in ok for w in r["walls"]]
    cpus = [c for r in ok for c in r["cpus"]]
    i = walls.index(min(walls))
    return {"wall_s": walls[i], "cpu_s": cpus[i], "min_cpu_s": min(cpus), "walls": walls, "cpus": cpus,
            "peak_extra_gib": max(r["peak_extra_gib"] for r in ok), "loss": ok[-1]["loss"],
            "grads_finite": all(r["grads_finite"] for r in ok), "children": len(ok),
            "loads": [x for r in ok for x in (r["load_before"], r["load_after"])]}


def ratio(case, dt, m, ref="eager", key="wall_s"):
    """(ours / theirs, is_upper_bound): theirs timed out -> its lower bound, so the ratio is an upper
    bound."""
    a = case.get(dt, {}).get("methods", {}).get(m, {})
    b = case.get(dt, {}).get("methods", {}).get(ref, {})
    if key in a and key in b:
        return a[key] / b[key], False
    est = case.get(dt, {}).get("methods", {}).get(ref + "_slice", {})
    if ref == "eager" and key in a and key in est:  # eager timed out: its V / SLICE time, scaled
        return a[key] / (est[key] * SLICE), "est"
    if key == "wall_s" and key in a and b.get("lower_bound_s"):
        return a[key] / b["lower_bound_s"], True
    return None, False


def fmt_ratio(r, bound):
    if r is None:
        return "-"
    return f"~{r:.3f}x (est.)" if bound == "est" else f"< {r:.2f}x" if bound else f"{r:.2f}x"


def targets(result):
    """The CPU targets (speed and memory against eager on 2 cores), checked against the measured cases."""
    rows = []
    for shape in result["shapes"]:
        by_dt = {dt: result["cases"].get(f"{shape} {dt}", {}) for dt in result["dtypes"]}
        for dt, label in (("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16")):
            if dt not in by_dt or not by_dt[dt]:
                continue
            rw, bw = ratio(by_dt, dt, "fused_cpp")
            rc, bc = ratio(by_dt, dt, "fused_cpp", key="min_cpu_s")
            if rw is not None:
                meas = f"wall {fmt_ratio(rw, bw)}, cpu {fmt_ratio(rc, bc)}"
                if dt == "float16":  # reported, not a target
                    rows.append((shape, "fp16 time vs eager fp16 (report)", meas, None))
                elif bw is True and rw > 1.0:  # only a lower bound on eager's time: no verdict
                    rows.append((shape, f"{label} time <= 1.0x eager {label}",
                                 meas + " (inconclusive)", None))
                else:
                    miss = "" if rw <= 1.0 else f" (missed by {100 * (rw - 1):.0f}%)"
                    rows.append((shape, f"{label} time <= 1.0x eager {label}", meas + miss, rw <= 1.0))
            cpp = by_dt[dt]["methods"].get("fused_cpp", {})
            if "peak_extra_gib" in cpp:
                allowed = by_dt[dt]["grads_gib"] + 0.5
                extra = cpp["peak_extra_gib"]
                miss = "" if extra <= allowed else f" (missed by {extra - allowed:.2f} GiB)"
                rows.append((shape, f"{label} peak RSS <= inputs + grads + 0.5 GiB",
                             f"extra {extra:.2f} GiB, allowed {allowed:.2f}{miss}", extra <= allowed))
            if "rel_err" in cpp and dt != "float32":
                rows.append((shape, f"{label} loss within 1e-4 of fp64"
                             + (" (report)" if dt == "float16" else ""),
                             f"{cpp['rel_err']:.1e}", cpp["rel_err"] <= 1e-4 if dt == "bfloat16" else None))
    return rows


def write_outputs(result, out):
    os.makedirs(out, exist_ok=True)
    result["targets"] = [dict(zip(("shape", "target", "measured", "met"), r)) for r in targets(result)]
    with open(os.path.join(out, "cpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    m = result["machine"]
    lines = ["# CPU benchmark: fused linear + cross-entropy, fwd+bwd of the mean loss", "",
             f"{m.get('cpu')}, {m.get('cpu_count')} cores, torch {m.get('torch')} ({m.get('threads')} "
             f"threads, ATen CPU capability {m.get('cpu_capability')}, oneDNN bf16 matmul: "
             f"{m.get('mkldnn_bf16')}, fp16: {m.get('mkldnn_fp16')}; F.linear_cross_entropy present: "
             f"{m.get('has_F_linear_cross_entropy')}), fused_lce {m.get('fused_lce')}, python "
             f"{m.get('python')}, {m.get('date')}, commit {m.get('commit', '?')}. 15% of labels ignored. "
             f"Load average (1, 5, 15 min) when the run started: {m.get('loadavg')}; the machine is shared "
             f"with other jobs. Whole run: {result.get('elapsed_s', 0) / 60:.1f} min.", "",
             f"cpp plans ({list(SHAPES)[2]}): {m.get('cpp_plans')}", "",
             "Time: min wall seconds over all fwd+bwd runs of a method (cpu = process CPU seconds of that "
             "run; min cpu = the least CPU seconds of any run; 2 threads, so cpu ~ 2 x wall on an idle "
             "machine); x eager compares min wall with min wall and min cpu with min cpu. Runs: children x "
             "runs each, methods interleaved. Peak extra: max RSS minus RSS after loading the inputs "
             "(gradients and temporaries). Error: |loss - fp64| / |fp64| of the same (rounded) inputs. Load: "
             "1-minute load average before and after each child (2 cores: above 2 the machine was shared "
             "during the row and times are inflated). Slow methods (16-bit ATen matmuls without oneDNN on "
             f"this CPU: {result.get('slow_dtypes')}) ran once with a {result.get('slow_timeout')} s limit "
             f"per child, torch_lce in float32 with {result.get('lce_timeout')} s; '> x' is the time from "
             "their first fwd+bwd's start to the kill.", ""]
    lines += case_tables(result["cases"])
    lines += ["## Targets (2 cores)", "", "| shape | target | measured (fused_cpp) | met |",
              "|---|---|---|---|"]
    lines += [f"| {s} | {t} | {v} | {'-' if ok is None else 'yes' if ok else 'NO'} |"
              for s, t, v, ok in targets(result)]
    if result.get("reruns"):
        rerun = result["reruns"]
        lines += ["", f"## Rerun: {rerun['what']}", "", rerun["note"], ""]
        lines += case_tables(rerun["cases"])
        lines += ["| shape | target | measured (fused_cpp) | met |", "|---|---|---|---|"]
        lines += [f"| {s} | {t} | {v} | {'-' if ok is None else 'yes' if ok else 'NO'} |"
                  for s, t, v, ok in targets(rerun) if "time" in t]
    with open(os.path.join(out, "cpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def case_tables(cases):
    """One markdown table per (shape, dtype) case."""
    lines = []
    for key, c in cases.items():
        shape = key.split()[0]
        lines += [f"## {key} -- {SHAPES.get(shape, '')} (inputs {c['inputs_gib']:.2f} GiB, grads "
                  f"{c['grads_gib']:.2f} GiB, fp64 loss {c.get('ref_loss', float('nan')):.6f})", "",
                  "| method | wall s | cpu s | min cpu s | x eager wall | x eager cpu | GFLOP/s | peak extra "
                  "GiB | loss | rel error | runs | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        n, d, v = (int(x) for x in shape.split("x"))
        eager = c["methods"].get("eager", {})
        for name, r in c["methods"].items():
            loads = [x for x in r.get("loads", []) if x is not None]
            load = f"{min(loads)}-{max(loads)}" if loads else "-"
            if "timeout_s" in r:
                lb = r.get("lower_bound_s")
                lines.append(f"| {name} | > {lb:.0f} (killed) | | | | | | | | | 1 | {load} |" if lb else
                             f"| {name} | killed at {r['timeout_s']} s before its first run | | | | | | | | "
                             f"| 1 | {load} |")
                continue
            if "wall_s" not in r:
                lines.append(f"| {name} | error: {r.get('error', '?')[-160:]!r} | | | | | | | | | | {load} |")
                continue
            sliced = name == "eager_slice"
            if sliced:  # the times as measured on V / SLICE rows; "x eager" of the other rows scales them
                name = f"eager on V/{SLICE} = {v // SLICE} rows (as measured)"
            xw = "-" if sliced else fmt_ratio(*ratio({"x": c}, "x", name))
            xc = "-" if sliced else fmt_ratio(*ratio({"x": c}, "x", name, key="min_cpu_s"))
            rate = 6 * n * d * (v // SLICE if sliced else v) / r["wall_s"] / 1e9
            runs = f"{r['children']}x{len(r['walls']) // max(r['children'], 1)}"
            lines.append(f"| {name} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['min_cpu_s']:.2f} | {xw} | "
                         f"{xc} | {rate:.0f} | {r['peak_extra_gib']:.2f} | {r['loss']:.6f} | "
                         f"{r.get('rel_err', float('nan')):.1e} | {runs} | {load} |")
        lines.append("")
    return lines


def extrapolate(a):
    """Eager on V / SLICE vocabulary rows for the cases of a.extrapolate where eager only has a lower bound
    (every GEMM and the cross-entropy are linear in V, so SLICE x its time estimates eager's); rewrites the
    JSON and md."""
    with open(a.extrapolate) as f:
        result = json.load(f)
    result["slice"] = SLICE
    for key, case in result["cases"].items():
        if "lower_bound_s" not in case["methods"].get("eager", {}):
            continue
        shape, dt = key.split()
        n, d, v = (int(x) for x in shape.split("x"))
        inputs = os.path.join(a.tmp, f"fused_lce_cpu_bench_{os.getpid()}_{shape}_{dt}.pt")
        try:
            run_child(["--reference", str(n), str(d), str(v), dt, inputs, "--no-loss"], a.timeout)
            load = loadavg()
            r = run_child(["--child", "eager_slice", inputs, "1"], a.timeout)
            r.setdefault("load", load)
        finally:
            if os.path.exists(inputs):
                os.remove(inputs)
        print(f"{key} eager_slice: {json.dumps(r)[:300]}", flush=True)
        case["methods"]["eager_slice"] = summarize([r])
        write_outputs(result, os.path.dirname(os.path.abspath(a.extrapolate)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="NxDxV")
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--methods", nargs="+", choices=METHODS, help="default: all four in float32, no "
                                                                   "fused_torch in 16-bit")
    ap.add_argument("--repeat-methods", nargs="+", default=["eager", "fused_cpp"], choices=METHODS,
                    help="the methods that run in rounds after the first (eager and ours, interleaved)")
    ap.add_argument("--reps", type=int, default=1, help="fwd+bwd runs per child")
    ap.add_argument("--rounds", type=int, default=2, help="children per method, interleaved with the others")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per child")
    ap.add_argument("--slow-timeout", type=int, default=20,
                    help="seconds per child of a slow (16-bit ATen) method")
    ap.add_argument("--lce-timeout", type=int, default=30,
                    help="seconds per child of torch_lce in float32 (it measured ~12x eager "
                         "here: 91 s at D 2048)")
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"), help="where the inputs are saved")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--render", metavar="JSON", help="only rewrite the markdown next to an existing cpu.json")
    ap.add_argument("--extrapolate", metavar="JSON", help="add eager on V / SLICE rows to the cases of a "
                                                          "cpu.json where eager timed out, and rewrite it")
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "INPUTS", "REPS"), help=argparse.SUPPRESS)
    ap.add_argument("--reference", nargs=5, metavar=("N", "D", "V", "DTYPE", "INPUTS"),
                    help=argparse.SUPPRESS)
    # --reference: only save the inputs
    ap.add_argument("--no-loss", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        method, inputs, reps = a.child
        return child_case(method, inputs, int(reps))
    if a.reference:
        n, d, v, dt, inputs = a.reference
        return child_reference(int(n), int(d), int(v), dt, inputs, loss=not a.no_loss)
    if a.render:
        with open(a.render) as f:
            return write_outputs(json.load(f), os.path.dirname(os.path.abspath(a.render)))
    if a.extrapolate:
        return extrapolate(a)

    sys.path.insert(0, ROOT)
    import torch

    from fused_lce.tools.bench import rel_err

    t_start = time.time()
    slow = slow_dtypes()
    result = {"machine": machine(), "shapes": a.shapes, "dtypes": a.dtypes, "reps": a.reps,
              "rounds": a.rounds, "slow_dtypes": slow, "slow_timeout": a.slow_timeout,
              "lce_timeout": a.lce_timeout, "cases": {}}
    print(json.dumps(result["machine"]), flush=True)
    for shape in a.shapes:
        n, d, v = (int(x) for x in shape.split("x"))
        for dt in a.dtypes:
            elt = 4 if dt == "float32" else 2
            case = {"inputs_gib": ((n + v) * d * elt + n * 8) / GIB, "grads_gib": (n + v) * d * elt / GIB,
                    "methods": {}}
            result["cases"][f"{shape} {dt}"] = case
            inputs = os.path.join(a.tmp, f"fused_lce_cpu_bench_{os.getpid()}_{shape}_{dt}.pt")
            ref = run_child(["--reference", str(n), str(d), str(v), dt, inputs], a.timeout)
            case["ref_loss"] = ref.get("loss", float("nan"))
            methods = a.methods or DEFAULT_METHODS[dt]
            runs = {m: [] for m in methods}
            try:
                for rnd in range(a.rounds):
                    for m in (methods if rnd % 2 == 0 else methods[::-1]):
                        is_slow = dt in slow and m != "fused_cpp"
                        if rnd > 0 and (is_slow or m not in a.repeat_methods):
                            continue
                        load = loadavg()
                        limit = (a.slow_timeout if is_slow else a.lce_timeout if m == "torch_lce"
                                 else a.timeout)
                        r = run_child(["--child", m, inputs, "1" if is_slow else str(a.reps)], limit)
                        r.setdefault("load", load)
                        runs[m].append(r)
                        print(f"{shape} {dt} {m} round {rnd}: {json.dumps(r)[:300]}", flush=True)
            finally:
                if os.path.exists(inputs):
                    os.remove(inputs)
            for m in methods:
                s = summarize(runs[m])
                if "loss" in s and "loss" in ref:
                    s["rel_err"] = rel_err(torch.tensor(s["loss"]),
                                           torch.tensor(ref["loss"], dtype=torch.float64))
                case["methods"][m] = s
            result["elapsed_s"] = time.time() - t_start
            write_outputs(result, a.out)  # partial results survive a later failure
    result["elapsed_s"] = time.time() - t_start
    write_outputs(result, a.out)

if __name__ == "__main__":
    main()
