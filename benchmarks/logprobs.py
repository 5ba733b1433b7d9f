"""Benchmark of fused_lce.linear_logprobs (per-token log-probs, with and without the entropy) against the
logits path (logits / temperature -> log_softmax -> gather, entropy from the logits: what an RL trainer does
without a fused head), forward + backward with random upstream gradients on both outputs.

On CUDA (``--device cuda``) every method runs in this process against TRL's chunked log-prob (``gpu_main``:
median ms by CUDA events over rounds of one run of every method, in an order shuffled each round, x the FLOP
floor, with and without entropy, fwd+bwd and under torch.no_grad()). On CPU each (shape, method) runs in a
fresh subprocess and records:
  - time: min (and all values) of --reps forward+backward runs (CUDA: synchronised), and the process CPU time,
  - peak extra memory: CPU: peak RSS (VmHWM) of the runs minus the RSS once the inputs exist (gradients
    included); CUDA: max_memory_allocated minus what was allocated before the runs,
  - the load average before / after (the machine may be shared: a case run under load is slower),
  - the per-token outputs, so the parent reports their error against a float64 reference of the same inputs
    (chunked over tokens; on the GPU for --device cuda) and the relative difference of dX against the logits
    path,
  - which provider ran the fused methods (and, for "triton", which of its two paths: the fused-GEMM path or
    cuBLAS
    + the row kernel).
Inputs come from fused_lce.tools.bench.make_inputs (15% of labels ignored), the environment from
fused_lce.tools.bench.environment. Writes logprobs.json and .md into --out (default benchmarks/results, where
the next run overwrites them).

    python benchmarks/logprobs.py                    # CPU: a small shape and the Qwen2.5-0.5B head
    python benchmarks/logprobs.py --device cuda --dtype bfloat16 --temperature 1    # CUDA: against TRL
    python benchmarks/logprobs.py --shapes 512x896x32768 --reps 2 --out /tmp/b
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEM = "logprobs"  # results file stem: one current result per benchmark, whatever the device
SHAPES = ["512x896x32768", "2048x896x151936"]  # small; Qwen2.5-0.5B head (tokens x hidden x vocab)
METHODS = ["fused", "fused_no_entropy", "logits", "logits_no_entropy"]
MIB = 2**20


def _load():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """Peak RSS of this process image (VmHWM). Not ru_maxrss: a child started by subprocess inherits the
    parent's maximum RSS at the fork in ru_maxrss, which would count the parent's memory."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))


def _reset_hwm() -> None:
    """Start VmHWM afresh from the current RSS (Linux >= 4.0), so input generation does not count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _run(method, h, w, y, temperature, backend):
    import torch

    entropy = not method.endswith("no_entropy")
    if method.startswith("fused"):
        import fused_lce

        out = fused_lce.linear_logprobs(h, w, y, temperature=temperature, return_entropy=entropy,
                                        backend=backend)
        return out if entropy else (out, None)
    logits = (h @ w.t()).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    valid = y != -100
    lp = torch.where(valid, logp_all.gather(-1, y.clamp(min=0)[:, None]).squeeze(-1), 0.0)
    ent = torch.where(valid, -(logp_all.exp() * logp_all).sum(-1), 0.0) if entropy else None
    return lp, ent


def _provider(args, h, w, y, entropy):
    """(provider name, its path) that linear_logprobs resolves for these inputs."""
    from fused_lce.core import registry
    from fused_lce.core import Options, Problem, Tensors

    opts = Options(backend=args.backend, temperature=args.temperature, entropy=entropy)
    t = Tensors(h, w, y, None)
    prov = registry.resolve(args.backend, Problem.of(t, opts, op="logprobs"))
    path = None
    if prov.name == "triton":
        path = "fused-GEMM" if prov.path_reason(t, opts) is None else "cuBLAS + row kernel"
    return prov.name, path


def child(args):
    """One method on one shape in this fresh process; prints one JSON line, saves outputs to args.save."""
    import torch

    from fused_lce.tools.bench import make_inputs

    n, d, v = (int(x) for x in args.shape.split("x"))
    dev = torch.device(args.device)
    h, w, y = make_inputs(n, d, v, getattr(torch, args.dtype), dev, seed=args.seed)
    provider = path = None
    if args.method.startswith("fused"):
        provider, path = _provider(args, h, w, y, not args.method.endswith("no_entropy"))
    h.requires_grad_()
    w.requires_grad_()
    g = torch.Generator(device=dev).manual_seed(args.seed + 1)
    g_lp, g_ent = torch.randn(n, generator=g, device=dev), torch.randn(n, generator=g, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    else:
        base = _rss()
        _reset_hwm()
    load0 = _load()
    walls, cpus = [], []
    for _ in range(args.reps):
        h.grad = w.grad = None
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        lp, ent = _run(args.method, h, w, y, args.temperature, args.backend)
        obj = (lp * g_lp).sum() + ((ent * g_ent).sum() if ent is not None else 0)
        obj.backward()
        sync()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        del obj
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) - base
    else:
        peak = _hwm() - base
    torch.save({"lp": lp.detach().cpu(), "ent": None if ent is None else ent.detach().cpu(),
                "dh": h.grad.detach().float().cpu()}, args.save)
    print(json.dumps({"wall_s": min(walls), "walls": walls, "cpu_s": cpus[walls.index(min(walls))],
                      "peak_extra_mib": peak / MIB, "load_before": load0, "load_after": _load(),
                      "provider": provider, "path": path}), flush=True)


def reference(shape, dtype, device, seed, temperature, chunk_elems=2**26):
    """float64 per-token (logprob, entropy) of the same inputs, chunked over tokens (on the GPU for a CUDA
    device, else on CPU); returned on CPU."""
    import torch

    from fused_lce.tools.bench import make_inputs

    n, d, v = (int(x) for x in shape.split("x"))
    h, w, y = make_inputs(n, d, v, getattr(torch, dtype), device, seed=seed)
    if torch.device(device).type != "cuda":
        h, y = h.cpu(), y.cpu()
    w = w.to(h.device).double()
    lp = torch.zeros(n, dtype=torch.float64, device=h.device)
    ent = torch.zeros(n, dtype=torch.float64, device=h.device)
    step = max(1, chunk_elems // v)
    for i in range(0, n, step):
        logp = torch.log_softmax((h[i:i + step].double() @ w.t()) / temperature, dim=-1)
        yy = y[i:i + step]
        ok = yy != -100
        lp[i:i + step] = torch.where(ok, logp.gather(1, yy.clamp(min=0)[:, None]).squeeze(1), 0.0)
        ent[i:i + step] = torch.where(ok, -(logp.exp() * logp).sum(1), 0.0)
        del logp
    return lp.cpu(), ent.cpu()


def run_case(args, shape, method, save):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--shape", shape, "--method",
           method, "--device", args.device, "--dtype", args.dtype, "--reps", str(args.reps), "--seed",
           str(args.seed), "--temperature", str(args.temperature), "--backend", args.backend, "--save", save]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout)[-600:]}
    return json.loads(lines[-1])


def render(report) -> str:
    env = report["environment"]
    out = [f"# linear_logprobs vs the logits path ({env['device']}, {report['args']['dtype']}, temperature "
           f"{report['args']['temperature']})", "",
           f"torch {env['torch']}, {env.get('gpu') or env.get('cpu', '')}, {env['threads']} threads, commit "
           f"{env.get('commit')}, {env['date']}; load average at start {env.get('loadavg')} (shared machine: "
           f"times are under that load). Forward + backward with random upstream gradients on both outputs; "
           f"min of {report['args']['reps']} runs; peak extra memory includes the gradients (dW = V x D).",
           "", "| shape (N x D x V) | method | provider (path) | fwd+bwd s | CPU s | peak extra MiB | logp "
           "max abs err | entropy max abs err | dX rel diff vs logits | load before / after |",
           "|" + "---|" * 10]
    for r in report["results"]:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['method']} | | error: {r['error'][-60:]!r} | | | | | | |")
            continue
        f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "-")  # noqa: E731
        prov = "-" if not r.get("provider") else r["provider"] + (f" ({r['path']})" if r.get("path") else "")
        out.append(f"| {r['shape']} | {r['method']} | {prov} | {r['wall_s']:.4f} | {r['cpu_s']:.2f} | "
                   f"{r['peak_extra_mib']:.0f} | {f('logp_err', '{:.1e}')} | {f('entropy_err', '{:.1e}')} | "
                   f"{f('dx_rel_diff', '{:.1e}')} | {r['load_before']} / {r['load_after']} |")
    return "\n".join(out) + "\n"


# -------------------------------------------------------------------------------------------- GPU, in process
# shapes: gpu.py's anchor shapes, then Llama-3's head, the Qwen3.5 vocabulary, a ragged, small, odd-V one
GPU_MORE_SHAPES = ["4096x4096x128256", "8192x4096x248320", "8191x5120x151936", "2048x1536x151936",
                   "8192x4096x151935"]
# fused = fused_lce.linear_logprobs; trl = TRL's ChunkedLogProbFunction on every token (the same work as
# ours); trl_valid = the same on the labelled tokens only (hidden[mask], as TRL's trainer calls it); _nograd:
# forward under torch.no_grad() (reference model / old policy)
GPU_METHODS = ["fused", "fused_no_entropy", "trl", "trl_no_entropy", "trl_valid", "trl_valid_no_entropy",
               "fused_nograd", "fused_no_entropy_nograd", "trl_nograd", "trl_no_entropy_nograd",
               "trl_valid_nograd"]
TRL_CHUNK = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE (vocabulary columns per tile)


def _stub_trl_trainer_utils():
    """TRL's backward imports ``maybe_gather_lm_head_ctx`` from ``trl.trainer.utils`` (a ZeRO-3 gather; a null
    context without DeepSpeed), whose module needs ``datasets``, absent on the device image: provide that null
    context alone, so the kernel itself runs unchanged."""
    import contextlib
    import types

    if "trl.trainer.utils" not in sys.modules:
        mod = types.ModuleType("trl.trainer.utils")
        mod.maybe_gather_lm_head_ctx = lambda *params: contextlib.nullcontext()
        sys.modules["trl.trainer.utils"] = mod


def _gpu_method(name, temperature):
    """fn(h, w, y) -> (logprobs [N], entropy [N] | None), 0 where the label is ignored."""
    import torch

    entropy = "no_entropy" not in name
    if name.startswith("fused"):
        import fused_lce

        def fused(h, w, y):
            out = fused_lce.linear_logprobs(h, w, y, temperature=temperature, return_entropy=entropy,
                                            validate=False)
            return out if entropy else (out, None)

        return fused
    _stub_trl_trainer_utils()
    from trl.kernels import ChunkedLogProbFunction

    outputs = ("entropy",) if entropy else ()
    valid_only = name.startswith("trl_valid")

    def trl(h, w, y):
        mask = y != -100
        if valid_only:
            lp, ent, *_ = ChunkedLogProbFunction.apply(h[mask], w, None, y[mask], temperature,
                                                       TRL_CHUNK, None, 1.0, outputs)
            scatter = lambda x: (None if x is None  # noqa: E731
                                 else x.new_zeros(mask.shape).masked_scatter(mask, x))
            return scatter(lp), scatter(ent)
        lp, ent, *_ = ChunkedLogProbFunction.apply(h, w, None, y.clamp(min=0), temperature,
                                                   TRL_CHUNK, None, 1.0, outputs)
        zero = lambda x: None if x is None else torch.where(mask, x, 0.0)  # noqa: E731
        return zero(lp), zero(ent)

    return trl


def _gpu_step(fn, nograd, h, w, y, g_lp, g_ent):
    """One timed call of a method: forward (+ backward of a random linear objective on both outputs)."""
    import torch

    def step():
        if nograd:
            with torch.no_grad():
                return fn(h, w, y), None
        hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
        lp, ent = fn(hh, ww, y)
        obj = (lp * g_lp).sum() + ((ent * g_ent).sum() if ent is not None else 0)
        return (lp, ent), torch.autograd.grad(obj, (hh, ww))
    return step


def _gpu_tools():
    """``gpu.py``'s GEMM rate, shuffled timing rounds, kernel breakdown and anchor shapes (imported late: the
    CPU parent never loads torch)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu import ANCHORS, gemm_rate, kernel_breakdown, time_rounds

    return gemm_rate, time_rounds, kernel_breakdown, [f"{n}x{d}x{v}" for n, d, v in ANCHORS]


def gpu_main(args) -> int:
    """Every method on every shape in this process: median fwd+bwd (or no-grad forward) ms by CUDA events, x
    the floor (8 N D V FLOPs fwd+bwd, 2 N D V no-grad, at the bf16 GEMM rate measured here), peak extra GiB,
    errors of the log-probs / entropy against float64 and dX against TRL's."""
    import statistics

    import torch

    sys.path.insert(0, ROOT)
    from fused_lce.tools.bench import environment, make_inputs, rel_err

    gemm_rate, time_rounds, kernel_breakdown, anchors = _gpu_tools()
    rate = gemm_rate()
    env = environment("cuda")
    env["commit"] = os.environ.get("FUSED_LCE_COMMIT") or env.get("commit")
    versions = {}
    for dist in ("trl", "transformers", "triton"):
        try:
            from importlib.metadata import version

            versions[dist] = version(dist)
        except Exception as e:  # noqa: BLE001
            versions[dist] = f"not installed: {e}"
    methods = args.methods.split(",") if args.methods != ",".join(METHODS) else GPU_METHODS
    shapes = args.shapes.split(",") if args.shapes != ",".join(SHAPES) else anchors + GPU_MORE_SHAPES
    report = {"environment": env, "args": dict(vars(args), shapes=",".join(shapes),
                                               methods=",".join(methods)),
              "gemm_tflops": rate, "versions": versions, "results": [],
              "knobs": {k: v for k, v in os.environ.items() if k.startswith("FUSED_LCE_")}}
    t0 = time.time()
    for shape in shapes:
        if time.time() - t0 > args.time_budget:
            print(f"time budget reached; skipping {shape}", flush=True)
            continue
        n, d, v = (int(x) for x in shape.split("x"))
        dtype = getattr(torch, args.dtype)
        h, w, y = make_inputs(n, d, v, dtype, "cuda", seed=args.seed)
        ref_lp, ref_ent = reference(shape, args.dtype, "cuda", args.seed, args.temperature)
        g = torch.Generator(device="cuda").manual_seed(args.seed + 1)
        g_lp, g_ent = torch.randn(n, generator=g, device="cuda"), torch.randn(n, generator=g, device="cuda")
        dx, steps, rows = {}, {}, []
        for name in methods:
            try:
                fn = _gpu_method(name, args.temperature)
            except Exception as e:  # noqa: BLE001
                rows.append({"shape": shape, "method": name, "error": f"{type(e).__name__}: {e}"[:300]})
                continue
            step = _gpu_step(fn, name.endswith("nograd"), h, w, y, g_lp, g_ent)
            r = {"shape": shape, "method": name}
            try:
                for _ in range(max(1, args.warmup)):
                    step()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                (lp, ent), grads = step()
                torch.cuda.synchronize()
                r["peak_extra_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
                r["logp_err"] = float((lp.double().cpu() - ref_lp).abs().max())
                r["entropy_err"] = (float((ent.double().cpu() - ref_ent).abs().max()) if ent is not None
                                    else None)
                if grads is not None:
                    dx[name] = grads[0].float()
                del lp, ent, grads
                steps[name] = step
            except Exception as e:  # noqa: BLE001
                r = {"shape": shape, "method": name, "error": f"{type(e).__name__}: {e}"[:300]}
            torch.cuda.empty_cache()
            rows.append(r)
        times, failed = time_rounds(steps, args.reps, seed=args.seed)
        for r in rows:
            name = r["method"]
            if name in failed:  # failed in the rounds: an error row (and no dX comparison)
                r = {"shape": shape, "method": name, "error": failed[name]}
                dx.pop(name, None)
            elif times.get(name):
                r["ms"], r["ms_all"] = statistics.median(times[name]), times[name]
                r["floor_ms"] = (2 if name.endswith("nograd") else 8) * n * d * v / (rate * 1e12) * 1e3
                r["x_floor"] = r["ms"] / r["floor_ms"]
            report["results"].append(r)
            print(json.dumps({k: x for k, x in r.items() if k != "ms_all"}), flush=True)
        for name in (args.profile.split(",") if args.profile else ()):
            if name in steps and name not in failed:
                try:
                    report.setdefault("profile", {}).setdefault(shape, {})[name] = \
                        kernel_breakdown(steps[name])
                except Exception as e:  # noqa: BLE001
                    report.setdefault("profile", {}).setdefault(shape, {})[name] = {
                        "error": f"{type(e).__name__}: {e}"[:300]}
        del steps
        for r in report["results"]:  # dX against TRL's on the same outputs (every token)
            if r["shape"] == shape and r["method"] in dx:
                base = "trl_no_entropy" if "no_entropy" in r["method"] else "trl"
                if base in dx and base != r["method"]:
                    r["dx_rel_diff_vs_trl"] = rel_err(dx[r["method"]], dx[base])
        del h, w, y, dx
        torch.cuda.empty_cache()
        _write_gpu(report, args)  # keep partial results if a later shape dies
    print(_write_gpu(report, args))
    return 0


def _write_gpu(report, args) -> str:
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, STEM)
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    text = render_gpu(report)
    with open(stem + ".md", "w") as f:
        f.write(text)
    return text


def render_gpu(report) -> str:
    env = report["environment"]
    out = [f"# linear_logprobs vs TRL's chunked log-prob on {env.get('gpu')} ({report['args']['dtype']}, "
           f"temperature {report['args']['temperature']})", "",
           f"torch {env['torch']}, versions {report['versions']}, knobs {report.get('knobs')}, commit "
           f"{env.get('commit')}, {env['date']}. bf16 GEMM "
           f"rate in this run (8192^3): {report['gemm_tflops']:.0f} TFLOP/s. 15% of labels ignored. fwd+bwd: "
           "random upstream gradients on the log-probs (and the entropy), floor 8 N D V FLOPs; `_nograd`: "
           "forward under torch.no_grad(), floor 2 N D V. Median of --reps timed rounds (one run of every "
           "method per round, in an order shuffled each round). `trl`: ChunkedLogProbFunction on every token "
           "(the same work as ours), `trl_valid`: on the labelled tokens only, as TRL's trainer calls it; "
           f"vocabulary tile {TRL_CHUNK}.", "",
           "| shape | method | ms (x floor) | peak extra GiB | logp max abs err | entropy max abs err | dX "
           "rel diff vs TRL |", "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['method']} | error: {r['error'][-80:]!r} | | | | |")
            continue
        f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "-")  # noqa: E731
        out.append(f"| {r['shape']} | {r['method']} | {r['ms']:.2f} ({r['x_floor']:.2f}) | "
                   f"{r['peak_extra_gib']:.2f} | {f('logp_err', '{:.1e}')} | {f('entropy_err', '{:.1e}')} | "
                   f"{f('dx_rel_diff_vs_trl', '{:.1e}')} |")
    out += ["", "Targets (fused vs TRL on the same tokens and vs TRL's trainer call; x floor limits 1.10 "
            "fwd+bwd, 1.05 no-grad):", "", "| shape | method | x floor (limit) | vs trl | vs trl_valid |",
            "|---|---|---|---|---|"]
    by = {(r["shape"], r["method"]): r for r in report["results"] if "ms" in r}
    for (shape, m), r in by.items():
        if not m.startswith("fused"):
            continue
        peer = m.replace("fused", "trl")
        valid = m.replace("fused", "trl_valid")
        lim = 1.05 if m.endswith("nograd") else 1.10
        cmp = lambda k: (f"{by[(shape, k)]['ms']:.2f} "  # noqa: E731
                         f"{'faster' if r['ms'] < by[(shape, k)]['ms'] else 'SLOWER'}"
                         if (shape, k) in by else "-")
        out.append(f"| {shape} | {m} | {r['x_floor']:.2f} ({lim:.2f}) "
                   f"{'yes' if r['x_floor'] <= lim else 'NO'} | {cmp(peer)} | {cmp(valid)} |")
    if report.get("profile"):
        out += ["", "Device time per kernel, one call (ms; `--profile`):", ""]
        for shape, per in report["profile"].items():
            for m, br in per.items():
                out.append(f"- {shape} {m}: " + "; ".join(
                    f"{k}: {x:.2f}" if isinstance(x, float) else f"{k}: {x}" for k, x in br.items()
                    if not isinstance(x, dict)))
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of NxDxV")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--backend", default="auto", help="fused_lce backend of the fused methods")
    p.add_argument("--reps", type=int, default=2, help="timed runs (CUDA: rounds) per method, at least 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per case")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--warmup", type=int, default=1, help="CUDA: untimed runs per method first")
    p.add_argument("--profile", default="", help="CUDA: comma list of methods to break down kernel by kernel")
    p.add_argument("--time-budget", type=float, default=420.0,
                   help="CUDA: stop starting new shapes after this (s)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if args.child:
        child(args)
        return 0
    if args.device == "cuda":
        return gpu_main(args)
    import torch

    sys.path.insert(0, ROOT)
    from fused_lce.tools.bench import environment, rel_err

    env = environment(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            ref_lp, ref_ent = reference(shape, args.dtype, args.device, args.seed, args.temperature)
            outs = {}
            for method in args.methods.split(","):
                save = os.path.join(tmp, f"{shape}_{method}.pt")
                r = {"shape": shape, "method": method, **run_case(args, shape, method, save)}
                if "error" not in r:
                    outs[method] = torch.load(save)
                    o = outs[method]
                    r["logp_err"] = float((o["lp"].double() - ref_lp).abs().max())
                    r["entropy_err"] = (float((o["ent"].double() - ref_ent).abs().max())
                                        if o["ent"] is not None else None)
                print(json.dumps({k: v for k, v in r.items() if k != "walls"}), flush=True)
                rows.append(r)
            for r in rows:  # dX against the logits path with the same outputs differentiated
                if r["shape"] != shape or "error" in r:
                    continue
                base = "logits_no_entropy" if r["method"].endswith("no_entropy") else "logits"
                if base in outs and r["method"] in outs:
                    r["dx_rel_diff"] = rel_err(outs[r["method"]]["dh"], outs[base]["dh"])
    report = {"environment": env, "args": vars(args), "results": rows}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, STEM)
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(render(report))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
