"""CPU benchmark of fused_lce's "cpp" backend against the alternatives (issue 3 targets).

For each shape (N tokens x D hidden x V vocabulary; 15% of labels = -100; fwd+bwd of the mean loss w.r.t. hidden
and weight) and dtype it runs every method in a fresh subprocess and records:
  - time: min (and all values) of --reps fwd+bwd runs, wall clock, plus the process CPU time of the same run,
  - peak RSS: resource.getrusage max RSS after the runs minus the RSS right after the inputs were created
    (inputs excluded, gradients and everything else included); inputs are generated chunk by chunk so that the
    baseline is not inflated by generation temporaries,
  - loss and its relative error against a float64 reference of the same (rounded) inputs, computed in chunks,
  - the load average before/after each case (the machine may be shared: a case run under load is slower),
  - GFLOP/s per core: 6*N*D*V (the three GEMMs) / process CPU seconds -- how close a method runs to the
    machine's GEMM rate whatever the load (time alone cannot show that on a shared machine).
Methods: eager (F.linear + F.cross_entropy, logits upcast to float32 as HF does), torch_lce (torch >= 2.13
F.linear_cross_entropy(options=torch.nn.LinearCrossEntropyOptions()), chunked), fused_torch (our "torch"
backend), fused_cpp (our "cpp" backend). Writes cpu.json and cpu.md into --out (default benchmarks/results).

    python benchmarks/cpu.py                                  # the full issue-3 run (about an hour on 2 cores)
    python benchmarks/cpu.py --shapes 512x896x151936 --dtypes float32 --methods eager fused_cpp --out /tmp/b
    python benchmarks/cpu.py --render benchmarks/results/cpu.json     # rewrite cpu.md from a JSON
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = ["2048x896x151936", "4096x1536x151936"]  # Qwen2.5-0.5B and -1.5B heads
DTYPES = ["float32", "bfloat16"]
METHODS = ["eager", "torch_lce", "fused_torch", "fused_cpp"]
IGNORE_FRAC = 0.15
GIB = 2**30


def make_inputs(n, d, v, dtype, seed=0):
    """Deterministic inputs, generated in chunks straight into their dtype (no large temporaries)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h = torch.empty(n, d, dtype=dtype)
    w = torch.empty(v, d, dtype=dtype)
    for t, scale in ((h, 1.0), (w, d**-0.5)):
        for i in range(0, t.shape[0], 8192):
            t[i:i + 8192] = torch.randn(min(8192, t.shape[0] - i), d, generator=g) * scale
    y = torch.randint(0, v, (n,), generator=g)
    y[torch.rand(n, generator=g) < IGNORE_FRAC] = -100
    return h, w, y


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def loadavg():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


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


def child_case(method, n, d, v, dtype_name, reps):
    """One method on one problem in this (fresh) process; prints one JSON line."""
    import torch

    dtype = getattr(torch, dtype_name)
    h, w, y = make_inputs(n, d, v, dtype)
    h.requires_grad_()
    w.requires_grad_()
    fn = method_fn(method)
    base = rss_now()
    load0 = loadavg()
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
    print(json.dumps({"wall_s": min(walls), "walls": walls, "cpu_s": cpus[walls.index(min(walls))], "cpus": cpus,
                      "peak_extra_gib": (peak - base) / GIB, "baseline_gib": base / GIB, "loss": loss,
                      "grads_finite": finite, "load_before": load0, "load_after": loadavg()}), flush=True)


def child_reference(n, d, v, dtype_name, chunk=512):
    """float64 mean loss of the same inputs, chunk by chunk over tokens."""
    import torch

    h, w, y = make_inputs(n, d, v, getattr(torch, dtype_name))
    w64 = w.double()
    total, count = 0.0, 0
    for i in range(0, n, chunk):
        z = h[i:i + chunk].double() @ w64.t()
        yy = y[i:i + chunk]
        ok = yy != -100
        lse = torch.logsumexp(z[ok], dim=1)
        total += float((lse - z[ok].gather(1, yy[ok, None]).squeeze(1)).sum())
        count += int(ok.sum())
    print(json.dumps({"loss": total / count}), flush=True)


def run_child(args, timeout):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True, text=True,
                       env=env, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout)[-600:]}
    return json.loads(lines[-1])


def machine():
    import torch

    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}
    try:
        from fused_lce.backends import cpp_cpu

        info["cpp_plans"] = {dt: cpp_cpu.describe(2048, 151936, 896, getattr(torch, dt)) for dt in DTYPES}
    except Exception as e:  # the benchmark still runs the other methods
        info["cpp_plans"] = f"unavailable: {e}"
    try:
        git = ["git", "-C", ROOT]
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        info["commit"] = (head + (" + uncommitted changes" if dirty else "")) if head else "not a git checkout"
    except OSError:
        info["commit"] = "unknown"
    return info


def targets(result):
    """The issue-3 targets, checked against the measured cases."""
    def case(shape, dt, m):
        return result["cases"].get(f"{shape} {dt}", {}).get("methods", {}).get(m, {})

    rows = []
    for shape in result["shapes"]:
        f32 = {m: case(shape, "float32", m) for m in METHODS}
        b16 = {m: case(shape, "bfloat16", m) for m in METHODS}
        cpp, eager, lce = f32["fused_cpp"], f32["eager"], f32["torch_lce"]
        if "wall_s" in cpp and "wall_s" in eager:
            r = cpp["wall_s"] / eager["wall_s"]
            rows.append((shape, "fp32 time <= 1.1x torch eager", f"{r:.2f}x", r <= 1.1))
        if "wall_s" in cpp and "wall_s" in lce:
            r = cpp["wall_s"] / lce["wall_s"]
            rows.append((shape, "fp32 time <= 0.4x torch_lce", f"{r:.2f}x", r <= 0.4))
        if "peak_extra_gib" in cpp:
            g = result["cases"][f"{shape} float32"]["grads_gib"]
            rows.append((shape, "fp32 peak RSS <= inputs + grads + 0.5 GiB",
                         f"extra {cpp['peak_extra_gib']:.2f} GiB (grads {g:.2f})", cpp["peak_extra_gib"] <= g + 0.5))
        bc = b16["fused_cpp"]
        if "wall_s" in bc and "wall_s" in cpp:
            rows.append((shape, "bf16 time <= our fp32 time", f"{bc['wall_s']:.2f} s vs {cpp['wall_s']:.2f} s",
                         bc["wall_s"] <= cpp["wall_s"]))
        if "rel_err" in bc:
            rows.append((shape, "bf16 loss within 1e-4 of fp64", f"{bc['rel_err']:.1e}", bc["rel_err"] <= 1e-4))
    return rows


def write_outputs(result, out):
    os.makedirs(out, exist_ok=True)
    result["targets"] = [dict(zip(("shape", "target", "measured", "met"), r)) for r in targets(result)]
    with open(os.path.join(out, "cpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    m = result["machine"]
    lines = ["# CPU benchmark: fused linear + cross-entropy, fwd+bwd of the mean loss", "",
             f"{m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), python "
             f"{m['python']}, {m['date']}, commit {m.get('commit', '?')}. 15% of labels ignored.", "",
             f"cpp plans: {m.get('cpp_plans')}", "",
             "Time: min wall seconds over the runs (cpu = process CPU seconds of that run). Peak extra: max RSS "
             "minus RSS after creating the inputs (gradients included). Error: |loss - fp64| / fp64 of the same "
             "inputs. Load: 1-min load average before the case (values well above the core count mean the machine "
             "was shared and the wall time is inflated).", ""]
    for key, c in result["cases"].items():
        lines += [f"## {key}  (inputs {c['inputs_gib']:.2f} GiB, grads {c['grads_gib']:.2f} GiB, fp64 loss "
                  f"{c.get('ref_loss', float('nan')):.6f})", "",
                  "| method | time s | cpu s | x eager | GFLOP/s/core | peak extra GiB | loss | rel error | load |",
                  "|---|---|---|---|---|---|---|---|---|"]
        n, d, v = (int(x) for x in key.split()[0].split("x"))
        eager = c["methods"].get("eager", {}).get("wall_s")
        for name, r in c["methods"].items():
            if "error" in r:
                lines.append(f"| {name} | error: {r['error'][-120:]!r} | | | | | | | |")
                continue
            ratio = f"{r['wall_s'] / eager:.2f}" if eager else "-"
            rate = 6 * n * d * v / r["cpu_s"] / 1e9
            lines.append(f"| {name} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {ratio} | {rate:.0f} | {r['peak_extra_gib']:.2f} | "
                         f"{r['loss']:.6f} | {r.get('rel_err', float('nan')):.1e} | {r['load_before']} |")
        lines.append("")
    lines += ["## Targets (issue 3)", "", "| shape | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {s} | {t} | {v} | {'yes' if ok else 'NO'} |" for s, t, v, ok in targets(result)]
    with open(os.path.join(out, "cpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="NxDxV")
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    ap.add_argument("--reps", type=int, default=2, help="fwd+bwd runs per case (the min is reported)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per case")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--render", metavar="JSON", help="only rewrite the markdown next to an existing cpu.json")
    ap.add_argument("--child", nargs=6, metavar=("METHOD", "N", "D", "V", "DTYPE", "REPS"), help=argparse.SUPPRESS)
    ap.add_argument("--reference", nargs=4, metavar=("N", "D", "V", "DTYPE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        method, n, d, v, dt, reps = a.child
        return child_case(method, int(n), int(d), int(v), dt, int(reps))
    if a.reference:
        n, d, v, dt = a.reference
        return child_reference(int(n), int(d), int(v), dt)
    if a.render:
        with open(a.render) as f:
            return write_outputs(json.load(f), os.path.dirname(os.path.abspath(a.render)))

    sys.path.insert(0, ROOT)
    result = {"machine": machine(), "shapes": a.shapes, "ignore_frac": IGNORE_FRAC, "reps": a.reps, "cases": {}}
    print(json.dumps(result["machine"]), flush=True)
    for shape in a.shapes:
        n, d, v = (int(x) for x in shape.split("x"))
        for dt in a.dtypes:
            elt = 4 if dt == "float32" else 2
            case = {"inputs_gib": ((n + v) * d * elt + n * 8) / GIB, "grads_gib": (n + v) * d * elt / GIB,
                    "methods": {}}
            result["cases"][f"{shape} {dt}"] = case
            ref = run_child(["--reference", str(n), str(d), str(v), dt], a.timeout)
            case["ref_loss"] = ref.get("loss", float("nan"))
            for method in a.methods:
                r = run_child(["--child", method, str(n), str(d), str(v), dt, str(a.reps)], a.timeout)
                if "loss" in r and "loss" in ref:
                    r["rel_err"] = abs(r["loss"] - ref["loss"]) / abs(ref["loss"])
                case["methods"][method] = r
                print(f"{shape} {dt} {method}: {json.dumps(r)}", flush=True)
                write_outputs(result, a.out)  # partial results survive a later failure
    write_outputs(result, a.out)


if __name__ == "__main__":
    main()
