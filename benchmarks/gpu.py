"""CUDA benchmark of fused_lce's "triton" backend against the alternatives, side by side in one process.

For each shape (N tokens x D hidden x V vocabulary; 15% of labels = -100; fwd+bwd of the mean loss w.r.t. hidden
and weight) it records, per method:
  - time: median over --reps timed runs (CUDA events) after --warmup runs,
  - peak extra memory: max_memory_allocated during one fwd+bwd minus memory allocated before it (inputs excluded,
    gradients included),
  - errors against a float32 reference computed from the same low-precision inputs (chunked; TF32 off): loss
    absolute error, dX and dW relative L2 errors,
and the floor: 6*N*D*V FLOPs at the bf16 GEMM rate measured in the same run on 8192^3.

Methods: fused_lce (default schedule), fused_lce_compact (FUSED_LCE_COMPACT=1), torch eager (F.linear, fp32
upcast, F.cross_entropy), and, when importable, Liger-Kernel (default, and accum_dtype=float32) and
cut-cross-entropy. Writes gpu.json, gpu.md and gpu.png into --out.

    PYTHONPATH=. python benchmarks/gpu.py --out bench-out
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

# ANCHORS.md shapes + a ragged one; the dtype is bf16 unless given
SHAPES = [
    (8192, 4096, 151936, "bfloat16"),
    (32768, 4096, 151936, "bfloat16"),
    (16384, 2048, 151936, "bfloat16"),
    (8192, 2304, 256000, "bfloat16"),
    (4096, 3584, 152064, "bfloat16"),
    (8191, 5120, 151936, "bfloat16"),
    (4096, 3584, 152064, "float16"),
]
IGNORE_FRAC = 0.15
_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def gemm_rate(dtype=torch.bfloat16, n=8192, reps=10):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    ms = statistics.median(times)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def make_inputs(n, d, v, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(n, d, device="cuda", generator=g).to(dtype)
    w = (torch.randn(v, d, device="cuda", generator=g) * (2.0 / math.sqrt(d))).to(dtype)
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[torch.rand(n, device="cuda", generator=g) < IGNORE_FRAC] = -100
    return h, w, y


def reference(h, w, y, chunk=4096):
    """float32 loss, dX, dW of the mean loss from the given (low-precision) inputs, chunked over tokens."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        w32 = w.float()
        n = h.shape[0]
        valid = y != -100
        nv = valid.sum().float()
        loss = torch.zeros((), device="cuda", dtype=torch.float64)
        dx = torch.empty(n, h.shape[1], device="cuda", dtype=torch.float32)
        dw = torch.zeros_like(w32)
        for i0 in range(0, n, chunk):
            h32 = h[i0:i0 + chunk].float()
            yy = y[i0:i0 + chunk]
            vv = valid[i0:i0 + chunk]
            z = h32 @ w32.t()
            lse = torch.logsumexp(z, dim=1)
            safe = torch.where(vv, yy, torch.zeros_like(yy))
            zt = z.gather(1, safe[:, None]).squeeze(1)
            loss += torch.where(vv, lse - zt, torch.zeros_like(lse)).double().sum()
            z.sub_(lse[:, None]).exp_()
            z[torch.arange(z.shape[0], device="cuda"), safe] -= 1.0
            z.mul_((vv.float() / nv)[:, None])
            dx[i0:i0 + chunk] = z @ w32
            dw.addmm_(z.t(), h32)
            del z
        return float(loss / nv.double()), dx, dw
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


# ---------------------------------------------------------------------------------------------- methods
def method_table():
    import fused_lce

    def ours(h, w, y):
        return fused_lce.linear_cross_entropy(h, w, y, backend="triton", validate=False)

    def eager(h, w, y):
        return F.cross_entropy(F.linear(h, w).float(), y, ignore_index=-100)

    methods = {"fused_lce": (ours, {}), "fused_lce_compact": (ours, {"FUSED_LCE_COMPACT": "1"}),
               "torch_eager": (eager, {})}
    versions = {}
    try:
        import liger_kernel
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as lflce

        versions["liger_kernel"] = getattr(liger_kernel, "__version__", None) or _dist_version("liger-kernel")
        methods["liger"] = (lambda h, w, y: lflce(h, w, y, ignore_index=-100), {})
        methods["liger_fp32acc"] = (lambda h, w, y: lflce(h, w, y, ignore_index=-100,
                                                          accum_dtype=torch.float32), {})
    except Exception as e:  # noqa: BLE001
        versions["liger_kernel"] = f"not importable: {type(e).__name__}: {e}"
    try:
        from cut_cross_entropy import linear_cross_entropy as cce

        versions["cut_cross_entropy"] = _dist_version("cut-cross-entropy")
        methods["cut_cross_entropy"] = (lambda h, w, y: cce(h, w, y, ignore_index=-100), {})
    except Exception as e:  # noqa: BLE001
        versions["cut_cross_entropy"] = f"not importable: {type(e).__name__}: {e}"
    return methods, versions


def _dist_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


class _Env:
    def __init__(self, env):
        self.env = env
        self.old = {}

    def __enter__(self):
        for k, v in self.env.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *a):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fwd_bwd(fn, h, w, y):
    hh = h.detach().requires_grad_()
    ww = w.detach().requires_grad_()
    loss = fn(hh, ww, y)
    dx, dw = torch.autograd.grad(loss, (hh, ww))
    return loss, dx, dw


def run_method(fn, env, h, w, y, ref, warmup, reps):
    with _Env(env):
        out = {}
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss, dx, dw = fwd_bwd(fn, h, w, y)
        torch.cuda.synchronize()
        out["peak_extra_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
        ref_loss, ref_dx, ref_dw = ref
        out["loss"] = float(loss)
        out["loss_abs_err"] = abs(float(loss) - ref_loss)
        out["dx_rel_err"] = float((dx.float() - ref_dx).norm() / ref_dx.norm())
        out["dw_rel_err"] = float((dw.float() - ref_dw).norm() / ref_dw.norm())
        del loss, dx, dw
        for _ in range(warmup):
            fwd_bwd(fn, h, w, y)
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            r = fwd_bwd(fn, h, w, y)
            e.record()
            torch.cuda.synchronize()
            del r
            times.append(s.elapsed_time(e))
        out["ms"] = statistics.median(times)
        out["ms_all"] = times
        return out


def profile_ours(h, w, y, env):
    """Device time per kernel family for one fused_lce fwd+bwd (torch.profiler)."""
    import fused_lce
    from torch.profiler import ProfilerActivity, profile

    with _Env(env):
        fwd_bwd(lambda a, b, c: fused_lce.linear_cross_entropy(a, b, c, backend="triton", validate=False), h, w, y)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fwd_bwd(lambda a, b, c: fused_lce.linear_cross_entropy(a, b, c, backend="triton", validate=False),
                    h, w, y)
            torch.cuda.synchronize()
    fam = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0)
        if not t or ev.key.startswith("aten::") or ev.key.startswith("fused_lce::"):
            continue
        fam[ev.key[:90]] = fam.get(ev.key[:90], 0.0) + t / 1e3
    return dict(sorted(fam.items(), key=lambda kv: -kv[1])[:12])


# ---------------------------------------------------------------------------------------------- output
def write_outputs(result, out_dir, show=True):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    meta = result["meta"]
    lines = [f"# fused_lce on {meta['gpu']} (torch {meta['torch']}, Triton {meta['triton']})", "",
             f"bf16 GEMM rate in this run (8192^3): {meta['gemm_tflops']:.0f} TFLOP/s. Floor = 6*N*D*V FLOPs at "
             "that rate. 15% of labels ignored; fwd+bwd of the mean loss w.r.t. hidden and weight.",
             "Cells: median ms (x floor) / peak extra GiB. Errors vs an fp32 reference: loss abs / dX rel / dW rel.",
             ""]
    methods = [m for m in result["methods"]]
    lines.append("| N x D x V dtype | floor ms | min GiB (dX+dW) | " + " | ".join(methods) + " |")
    lines.append("|---" * (3 + len(methods)) + "|")
    for s in result["shapes"]:
        cells = []
        for m in methods:
            r = s["results"].get(m)
            if r is None or "error" in r:
                cells.append("n/a" if r is None else "error")
            else:
                cells.append(f"{r['ms']:.1f} ({r['ms'] / s['floor_ms']:.2f}) / {r['peak_extra_gib']:.2f}")
        lines.append(f"| {s['n']}x{s['d']}x{s['v']} {s['dtype']} | {s['floor_ms']:.1f} | {s['min_gib']:.2f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Errors (loss abs / dX rel L2 / dW rel L2):", "",
              "| shape | " + " | ".join(methods) + " |", "|---" * (1 + len(methods)) + "|"]
    for s in result["shapes"]:
        cells = []
        for m in methods:
            r = s["results"].get(m)
            if r is None or "error" in r:
                cells.append("n/a" if r is None else r["error"][:60].replace("|", "/"))
            else:
                cells.append(f"{r['loss_abs_err']:.1e} / {r['dx_rel_err']:.1e} / {r['dw_rel_err']:.1e}")
        lines.append(f"| {s['n']}x{s['d']}x{s['v']} {s['dtype']} | " + " | ".join(cells) + " |")
    if result.get("probe"):
        pr = result["probe"]
        lines += ["", f"One default-schedule token chunk in isolation ({pr['rows']} tokens of 8192x4096x151936, ms): "
                  + "; ".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in pr.items()
                              if k != "rows")]
    for gp in result.get("gaps") or []:
        lines += ["", f"GPU idle in one fwd+bwd of {gp['shape']}: span {gp['span_ms']:.2f} ms, kernels busy "
                  f"{gp['busy_ms']:.2f} ms; host enqueue fwd {gp['host_fwd_ms']:.2f} ms, bwd {gp['host_bwd_ms']:.2f} ms; "
                  "largest gaps (us): " + ", ".join(f"{g['gap_us']:.0f} before {g['before'][:30]!r}"
                                                   for g in gp["gaps"][:3])]
    if result.get("profile"):
        lines += ["", "Device time per kernel, one fused_lce fwd+bwd (ms):", ""]
        for key, prof in result["profile"].items():
            lines.append(f"- {key}: " + "; ".join(f"{k}: {v:.2f}" for k, v in prof.items()))
    with open(os.path.join(out_dir, "gpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(14, 5))
        labels = [f"{s['n']}x{s['d']}x{s['v']} {_SHORT.get(s['dtype'], s['dtype'])}" for s in result["shapes"]]
        width = 0.8 / max(1, len(methods))
        for k, m in enumerate(methods):
            xs = [i + k * width for i in range(len(labels))]
            t = [s["results"].get(m, {}).get("ms", float("nan")) / s["floor_ms"] for s in result["shapes"]]
            g = [s["results"].get(m, {}).get("peak_extra_gib", float("nan")) / s["min_gib"] for s in result["shapes"]]
            axes[0].bar(xs, t, width, label=m)
            axes[1].bar(xs, g, width, label=m)
        for ax, title in ((axes[0], "fwd+bwd time / GEMM floor"), (axes[1], "peak extra memory / (dX + dW)")):
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))])
            ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_title(title)
            ax.set_yscale("log")
        axes[0].axhline(1.15, color="r", lw=0.8, ls="--")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{meta['gpu']}, torch {meta['torch']}, Triton {meta['triton']}")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "gpu.png"), dpi=110)
    except Exception as e:  # noqa: BLE001
        print("plot failed:", e)
    if show:
        print("\n".join(lines))


def _time(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def gap_report(n, d, v, env=None):
    """Where the GPU idles during one fused_lce fwd+bwd: kernel-busy time vs span, the largest idle gaps with
    the kernels around them and the host calls overlapping them, and the host time to enqueue fwd / bwd."""
    import fused_lce
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    h, w, y = make_inputs(n, d, v, torch.bfloat16)
    fn = lambda a, b, c: fused_lce.linear_cross_entropy(a, b, c, backend="triton", validate=False)  # noqa: E731
    out = {"shape": f"{n}x{d}x{v}"}
    with _Env(env or {}):
        for _ in range(2):
            fwd_bwd(fn, h, w, y)
        torch.cuda.synchronize()
        hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
        t0 = time.perf_counter()
        loss = fn(hh, ww, y)
        t1 = time.perf_counter()
        torch.autograd.grad(loss, (hh, ww))
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        out.update(host_fwd_ms=(t1 - t0) * 1e3, host_bwd_ms=(t2 - t1) * 1e3, wall_ms=(t3 - t0) * 1e3)
        t0 = time.perf_counter()
        for _ in range(20):
            torch.cuda.mem_get_info()
        out["mem_get_info_us"] = (time.perf_counter() - t0) / 20 * 1e6
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fwd_bwd(fn, h, w, y)
            torch.cuda.synchronize()
    evs = prof.events()
    kern = sorted((e.time_range.start, e.time_range.end, e.name) for e in evs if e.device_type == DeviceType.CUDA)
    cpu = [(e.time_range.start, e.time_range.end, e.name) for e in evs if e.device_type == DeviceType.CPU]
    if not kern:
        return out
    busy, gaps, end = 0.0, [], kern[0][0]
    prev = kern[0][2]
    for s, e, name in kern:
        if s > end:
            gaps.append((s - end, end, s, prev[:50], name[:50]))
        busy += max(0.0, e - max(s, end))
        if e > end:
            end, prev = e, name
    out["span_ms"] = (end - kern[0][0]) / 1e3
    out["busy_ms"] = busy / 1e3
    out["n_kernels"] = len(kern)
    top = []
    for g, a, b, pn, nn in sorted(gaps, reverse=True)[:6]:
        over = sorted(((min(e, b) - max(s, a), name[:40]) for s, e, name in cpu if s < b and e > a), reverse=True)[:4]
        top.append({"gap_us": round(g, 1), "after": pn, "before": nn, "host": [(round(t, 1), nm) for t, nm in over]})
    out["gaps"] = top
    print("GAPS " + json.dumps(out), flush=True)
    return out


def probe(n=8192, d=4096, v=151936, rows=2736, rate=None):
    """Time each stage of one default-schedule token chunk in isolation (profile evidence for the notes)."""
    from fused_lce.backends import triton_cuda as tc
    from fused_lce.backends.base import Config

    h, w, y = make_inputs(n, d, v, torch.bfloat16)
    hc, yc = h[:rows], y[:rows]
    z = torch.empty(rows, v, device="cuda")
    acc = torch.zeros(v, d, device="cuda")
    dx = torch.empty(rows, d, device="cuda", dtype=torch.bfloat16)
    p = tc._Problem(h, w, y, None, Config(vocab_total=v), (True, True, False))
    g = torch.tensor(1.0 / n, device="cuda")
    lse, loss = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
    corr = torch.empty(rows, device="cuda", dtype=torch.int8)
    out = {"rows": rows}
    out["z_mm_fp32out_ms"] = _time(lambda: torch.mm(hc, w.t(), out_dtype=torch.float32, out=z))
    out["z_mm_bf16out_ms"] = _time(lambda: torch.mm(hc, w.t()))
    dz = p.dz_view(z)
    out["rows_kernel_fused_ms"] = _time(lambda: p.launch(z, rows, yc, stats=2, grad=True, dz=dz, g=g, lse=lse,
                                                         loss=loss, correct=corr))
    out["rows_kernel_stats_only_ms"] = _time(lambda: p.launch(z, rows, yc, stats=2, grad=False, lse=lse,
                                                              loss=loss, correct=corr))
    out["dx_mm_ms"] = _time(lambda: torch.mm(dz, w, out=dx))
    dzc = dz.contiguous()
    out["dx_mm_contig_dz_ms"] = _time(lambda: torch.mm(dzc, w, out=dx))
    try:
        out["dw_addmm_fp32acc_ms"] = _time(lambda: torch.addmm(acc, dz.t(), hc, out_dtype=torch.float32, out=acc))
        out["addmm_fp32_self_supported"] = True
    except Exception as e:  # noqa: BLE001
        out["addmm_fp32_self_supported"] = f"{type(e).__name__}: {str(e)[:200]}"
    out["dw_mm_fp32out_ms"] = _time(lambda: torch.mm(dz.t(), hc, out_dtype=torch.float32, out=acc))
    out["dw_mm_bf16out_ms"] = _time(lambda: torch.mm(dz.t(), hc))
    # correctness of the in-place fp32 accumulation (tiny): acc + a@b
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(256, 128, device="cuda")
    want = c + a.float() @ b.float()
    try:
        torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
        out["addmm_fp32_rel_err"] = float((c - want).norm() / want.norm())
    except Exception:  # noqa: BLE001
        pass
    flops = 2 * rows * d * v
    if rate:
        out["gemm_floor_ms_per_product"] = flops / (rate * 1e12) * 1e3
    out["bytes_rows_kernel_GB"] = rows * v * (4 + 4 + 2) / 1e9
    print("PROBE " + json.dumps(out), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--shapes", default="all", help="'all', or indices into SHAPES, e.g. 0,4")
    ap.add_argument("--methods", default="", help="comma-separated subset (default: all importable)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="torch.profiler breakdown of fused_lce per shape")
    ap.add_argument("--probe", action="store_true", help="time each stage of one token chunk first")
    ap.add_argument("--time-budget", type=float, default=420.0, help="stop starting new shapes after this (s)")
    args = ap.parse_args(argv)
    t_start = time.time()
    import triton

    methods, versions = method_table()
    if args.methods:
        keep = args.methods.split(",")
        methods = {k: v for k, v in methods.items() if k in keep}
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    rate = gemm_rate()
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "gemm_tflops": rate, "versions": versions,
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}
    print(json.dumps(meta), flush=True)
    result = {"meta": meta, "methods": list(methods), "shapes": [], "profile": {}}
    if args.probe:
        try:
            result["probe"] = probe(rate=rate)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        torch.cuda.empty_cache()
        result["gaps"] = []
        for shp in ((4096, 3584, 152064), (8192, 4096, 151936)):
            try:
                result["gaps"].append(gap_report(*shp))
            except Exception:  # noqa: BLE001
                traceback.print_exc()
            torch.cuda.empty_cache()
    for n, d, v, dt in shapes:
        if time.time() - t_start > args.time_budget:
            print(f"time budget reached; skipping {n}x{d}x{v} {dt}", flush=True)
            continue
        dtype = getattr(torch, dt)
        h, w, y = make_inputs(n, d, v, dtype)
        ref = reference(h, w, y)
        floor_ms = 6 * n * d * v / (rate * 1e12) * 1e3
        elt = h.element_size()
        entry = {"n": n, "d": d, "v": v, "dtype": dt, "floor_ms": floor_ms,
                 "min_gib": (n * d + v * d) * elt / 2**30, "results": {}}
        for name, (fn, env) in methods.items():
            t0 = time.time()
            try:
                entry["results"][name] = run_method(fn, env, h, w, y, ref, args.warmup, args.reps)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                entry["results"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            r = entry["results"][name]
            torch.cuda.empty_cache()
            print(f"{n}x{d}x{v} {dt} {name}: " + (f"{r['ms']:.2f} ms ({r['ms'] / floor_ms:.2f}x) "
                  f"{r['peak_extra_gib']:.2f} GiB loss_err {r['loss_abs_err']:.1e} dx {r['dx_rel_err']:.1e} "
                  f"dw {r['dw_rel_err']:.1e}" if "ms" in r else r["error"]) + f" [{time.time() - t0:.0f}s]",
                  flush=True)
        if args.profile:
            for key, env in (("default", {}), ("compact", {"FUSED_LCE_COMPACT": "1"})):
                try:
                    result["profile"][f"{n}x{d}x{v} {dt} {key}"] = profile_ours(h, w, y, env)
                except Exception as e:  # noqa: BLE001
                    print("profile failed:", e)
        result["shapes"].append(entry)
        del h, w, y, ref
        torch.cuda.empty_cache()
        write_outputs(result, args.out, show=False)  # keep partial results if a later shape dies
    write_outputs(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
