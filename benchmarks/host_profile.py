"""Where one CUDA fwd+bwd step's time goes besides the kernels: host work, synchronisations, device idle.

For each shape (bf16, 15% of labels ignored, fwd+bwd of the mean loss, as in gpu.py) and method it records
  - wall_ms: median CUDA-event time of the step (what gpu.py reports),
  - host_ms: median host time to issue the step (``perf_counter`` around it, no final sync; includes the host's
    waits at synchronisations),
  - from one torch.profiler run (CPU + CUDA): lead_ms (step start on the host to the first kernel), span / busy /
    idle ms of the kernels, the number of kernels, and the host's synchronising runtime calls with their durations,
  - the top host functions of one step (cProfile, cumulative), for ``fused_lce`` only,
  - with ``--lead``: the host time from the call to the first logits-GEMM launch and its self-time profile (the
    device idles through it: nothing large is queued before that GEMM).
Writes host_profile.json and host_profile.md into --out.

    PYTHONPATH=. python benchmarks/host_profile.py --out bench-out [--shapes 8192x4096x151936,...]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import _Env, fwd_bwd, method_table  # noqa: E402

from fused_lce.tools.bench import environment, make_inputs  # noqa: E402

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemGetInfo", "cudaEventSynchronize",
              "cudaMemcpyAsync", "cuStreamSynchronize", "cuMemGetInfo")


def timed(fn, h, w, y, reps):
    walls, hosts = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        t0 = time.perf_counter()
        r = fwd_bwd(fn, h, w, y)
        hosts.append((time.perf_counter() - t0) * 1e3)
        e.record()
        torch.cuda.synchronize()
        walls.append(s.elapsed_time(e))
        del r
    return statistics.median(walls), statistics.median(hosts)


def profiled(fn, h, w, y):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("step"):
            fwd_bwd(fn, h, w, y)
        torch.cuda.synchronize()
    evs = list(prof.events())
    step = next(e for e in evs if e.name == "step")
    kern = sorted((e.time_range.start, e.time_range.end) for e in evs if e.device_type == DeviceType.CUDA)
    busy, end = 0.0, kern[0][0]
    for s, e in kern:
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    syncs = [(round((e.time_range.start - step.time_range.start) / 1e3, 3), e.name,
              round((e.time_range.end - e.time_range.start) / 1e3, 3))
             for e in evs if e.device_type == DeviceType.CPU and e.name.startswith(SYNC_CALLS)]
    span = (kern[-1][1] - kern[0][0]) / 1e3
    return {"lead_ms": (kern[0][0] - step.time_range.start) / 1e3, "span_ms": span, "busy_ms": busy / 1e3,
            "idle_ms": span - busy / 1e3, "kernels": len(kern), "syncs": syncs[:40]}


def host_top(fn, h, w, y, k=25, sort="cumulative"):
    pr = cProfile.Profile()
    torch.cuda.synchronize()
    pr.enable()
    fwd_bwd(fn, h, w, y)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(k)
    return s.getvalue()


class _AtGemm(Exception):
    """Raised by the patched logits GEMM: the step is cut at its first launch."""


def lead_profile(fn, h, w, y, reps=30, k=40):
    """Host time from the loss call to the first logits-GEMM launch of the triton provider (the device has nothing
    large to run before it, so this is device idle), median ms, and a self-time profile of that part."""
    from fused_lce.backends.triton.kernels import gemm as kg

    real = kg.lce_gemm
    mark = []

    def cut(*a, **kw):
        mark.append(time.perf_counter())
        raise _AtGemm

    def one(pr=None):
        hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if pr is not None:
            pr.enable()
        try:
            fn(hh, ww, y)
        except Exception:  # noqa: BLE001 - _AtGemm, possibly re-wrapped on its way through the dispatcher
            if not mark:
                raise
        finally:
            if pr is not None:
                pr.disable()
        return (mark.pop() - t0) * 1e3 if mark else float("nan")

    kg.lce_gemm = cut
    try:
        ms = statistics.median(one() for _ in range(reps))
        pr = cProfile.Profile()
        for _ in range(reps):
            one(pr)
    finally:
        kg.lce_gemm = real
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(k)
    return ms, f"{reps} calls, cut at the first logits-GEMM launch\n" + s.getvalue()


def _host_us(call, reps=40):
    """Median host microseconds to issue ``call`` (asynchronous launches; the queue is drained every 10)."""
    call()
    torch.cuda.synchronize()
    ts = []
    for k in range(reps):
        t0 = time.perf_counter()
        call()
        ts.append((time.perf_counter() - t0) * 1e6)
        if k % 10 == 9:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(ts)


def launch_costs(h, w, y):
    """Host microseconds per call of the step's building blocks at this shape (the triton provider's kernels, the
    cuBLAS products, a few small torch ops and the driver's formula functions)."""
    from fused_lce.backends.triton import cublas
    from fused_lce.backends.triton.kernels import gemm as kg
    from fused_lce.backends.triton.kernels import rows as kr
    from fused_lce.core import Options, formulas, types

    n, d = h.shape
    v = w.shape[0]
    cfg = kg.default_config(d)
    nt = kg.num_tiles_n(v, cfg)
    vp = -(-v // 64) * 64
    e = torch.empty(n, vp, device=h.device, dtype=h.dtype)[:, :v]
    tiles = kg.TileStats.new(n, nt, h.device, False)
    f = lambda: torch.empty(n, device=h.device)  # noqa: E731
    m, s, zs, lse, g, tgt = f(), f(), f(), f(), f(), f()
    am = torch.empty(n, device=h.device, dtype=torch.int64)
    g.fill_(1.0)
    dx = torch.empty_like(h)
    dw = torch.empty_like(w)
    one = torch.ones((), device=h.device)
    mask = y != -100
    idx = torch.arange(n, device=h.device)
    x = torch.randn(n, device=h.device)
    opts = Options()
    st = types.Stats(m.fill_(0), s.fill_(1), tgt.zero_(), zs.zero_(), am.zero_())
    out = {
        "lce_gemm EXP": lambda: kg.lce_gemm(kg.MODE_EXP, h, w, e, cfg, tiles=tiles),
        "combine": lambda: kr.combine(tiles, nt, m, s, zs, am, col_off=0, lse=lse),
        "target_logit": lambda: kr.target_logit(h, w, None, y, 0, tgt),
        "dz_from_exp": lambda: kr.dz_from_exp(e, tiles.m, cfg.bn, lse, g, None, y, 0),
        "scale_unless_one_ (dX, dW)": lambda: kr.scale_unless_one_([dx, dw], one),
        "cuBLAS dX": lambda: cublas._dx_into(e, w, dx),
        "cuBLAS dW": lambda: cublas._dw_into(e, h, dw, accumulate=False),
        "torch.where(mask, x, 0.0)": lambda: torch.where(mask, x, 0.0),
        "x.index_select(0, idx)": lambda: h.index_select(0, idx),
        "argsort(uint8, stable)": lambda: torch.argsort(mask.logical_not().to(torch.uint8), stable=True),
        "sort(bool, stable, descending)": lambda: torch.sort(mask, stable=True, descending=True),
        "mask.sum()": lambda: mask.sum(),
        "formulas.label_classes": lambda: formulas.label_classes(y, opts, v),
        "formulas.loss_from_stats": lambda: formulas.loss_from_stats(st, y, opts, v),
        "formulas.token_weights": lambda: formulas.token_weights(*formulas.label_classes(y, opts, v)),
    }
    return {k: round(_host_us(c), 1) for k, c in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8192x4096x151936,2048x1536x151936")
    ap.add_argument("--methods", default="fused_lce,cce_torch_compile")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--launch-costs", action="store_true", help="host microseconds per building-block call")
    ap.add_argument("--lead", action="store_true", help="host time to the first logits-GEMM launch (fused_lce)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    methods, versions = method_table()
    env = environment("cuda")
    env["commit"] = os.environ.get("FUSED_LCE_COMMIT") or env.get("commit")
    result = {"meta": {"environment": env, "versions": versions,
                       "knobs": {k: v for k, v in os.environ.items() if k.startswith("FUSED_LCE_")}}, "rows": []}
    for shape in args.shapes.split(","):
        n, d, v = map(int, shape.split("x"))
        h, w, y = make_inputs(n, d, v, torch.bfloat16, "cuda", seed=n + v)
        for name in args.methods.split(","):
            if name not in methods:
                continue
            fn, menv = methods[name]
            with _Env(menv):
                for _ in range(3):
                    fwd_bwd(fn, h, w, y)
                wall, host = timed(fn, h, w, y, args.reps)
                row = {"shape": shape, "method": name, "wall_ms": wall, "host_ms": host, **profiled(fn, h, w, y)}
                if name.startswith("fused_lce"):
                    row["host_top"] = host_top(fn, h, w, y)
                    row["host_self"] = host_top(fn, h, w, y, 40, "tottime")
                    if args.lead:
                        row["to_gemm_ms"], row["lead_self"] = lead_profile(fn, h, w, y)
            print(json.dumps({k: (round(x, 3) if isinstance(x, float) else x) for k, x in row.items()
                              if k not in ("host_top", "host_self", "lead_self", "syncs")}), flush=True)
            result["rows"].append(row)
        if args.launch_costs:
            result.setdefault("launch_us", {})[shape] = launch_costs(h, w, y)
            print("launch us", shape, json.dumps(result["launch_us"][shape]), flush=True)
        del h, w, y
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "host_profile.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "host_profile.md"), "w") as f:
        f.write(f"# Host work and device idle per fwd+bwd step (torch {torch.__version__}, commit {env['commit']})\n\n"
                "| shape | method | wall ms | host ms | lead ms | span ms | busy ms | idle in span ms | kernels |\n"
                "|---|---|---|---|---|---|---|---|---|\n")
        for r in result["rows"]:
            f.write(f"| {r['shape']} | {r['method']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['lead_ms']:.2f} "
                    f"| {r['span_ms']:.2f} | {r['busy_ms']:.2f} | {r['idle_ms']:.2f} | {r['kernels']} |\n")
        for r in result["rows"]:
            f.write(f"\n## {r['shape']} {r['method']}: synchronising host calls (ms from step start, name, ms)\n\n"
                    + "".join(f"- {s}\n" for s in r["syncs"]))
            if "to_gemm_ms" in r:
                f.write(f"\nHost ms from the call to the first logits-GEMM launch: {r['to_gemm_ms']:.3f}\n")
            for key in ("host_top", "host_self", "lead_self"):
                if key in r:
                    f.write("\n```\n" + r[key] + "```\n")
        for shape, costs in result.get("launch_us", {}).items():
            f.write(f"\n## {shape}: host microseconds per call\n\n"
                    + "".join(f"- {k}: {c}\n" for k, c in costs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
